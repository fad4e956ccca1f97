package objstore

import (
	"bytes"
	"context"
	"fmt"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/s3"
)

// Store is where segments go: an object store, or a test's.
type Store interface {
	// Put writes body at key; an error means it was not written (the
	// sink tries again).
	Put(ctx context.Context, key string, body []byte) error
}

// Reader reads the layout back: keyway audit's source.
type Reader interface {
	// ListDirs returns the names one level under prefix, sorted.
	ListDirs(ctx context.Context, prefix string) ([]string, error)
	// List returns the keys under prefix, sorted.
	List(ctx context.Context, prefix string) ([]string, error)
	// Get reads one object.
	Get(ctx context.Context, key string) ([]byte, error)
}

// S3 is a Store on an S3 bucket, through the official AWS SDK for Go v2.
// The SDK was chosen over minio-go for its credentials chain, which is
// the one operators configure everywhere else: the AWS_* environment,
// shared config and profiles, web identity (EKS IRSA:
// AWS_WEB_IDENTITY_TOKEN_FILE and AWS_ROLE_ARN), EKS Pod Identity and ECS
// container credentials, and EC2 instance roles; and for AWS_ENDPOINT_URL
// (and AWS_ENDPOINT_URL_S3), which points it at any S3-compatible server.
// It costs more binary than minio-go (see docs/audit.md).
type S3 struct {
	client *s3.Client
	bucket string
}

// NewS3 makes a Store on bucket from the standard AWS configuration.
// pathStyle addresses objects as ENDPOINT/BUCKET/KEY, which SeaweedFS and
// MinIO on host:port need. Without a region configured, us-east-1 is
// used (S3-compatible servers ignore it). Credentials are looked up at
// the first Put, not here: a missing one is a Put error.
func NewS3(ctx context.Context, bucket string, pathStyle bool) (*S3, error) {
	cfg, err := config.LoadDefaultConfig(ctx, config.WithDefaultRegion("us-east-1"))
	if err != nil {
		return nil, fmt.Errorf("object storage configuration (AWS_* environment, shared config): %w", err)
	}
	client := s3.NewFromConfig(cfg, func(o *s3.Options) { o.UsePathStyle = pathStyle })
	return &S3{client: client, bucket: bucket}, nil
}

// Put writes one segment.
func (s *S3) Put(ctx context.Context, key string, body []byte) error {
	_, err := s.client.PutObject(ctx, &s3.PutObjectInput{
		Bucket: aws.String(s.bucket), Key: aws.String(key), Body: bytes.NewReader(body),
		ContentLength: aws.Int64(int64(len(body))), ContentType: aws.String("application/x-ndjson"),
	})
	if err != nil {
		return fmt.Errorf("s3://%s/%s: %w", s.bucket, key, err)
	}
	return nil
}

// List returns the keys under prefix (every page), for readers and tests.
func (s *S3) List(ctx context.Context, prefix string) ([]string, error) {
	var out []string
	p := s3.NewListObjectsV2Paginator(s.client, &s3.ListObjectsV2Input{Bucket: aws.String(s.bucket), Prefix: aws.String(prefix)})
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			return out, fmt.Errorf("listing s3://%s/%s: %w", s.bucket, prefix, err)
		}
		for _, o := range page.Contents {
			out = append(out, aws.ToString(o.Key))
		}
	}
	return out, nil
}

// ListDirs returns the names one level under prefix ("" for the bucket's
// top): listing PREFIX/ yields the sets, listing PREFIX/SET/ their runs
// (run-RUN), with the delimiter "/" and no index.
func (s *S3) ListDirs(ctx context.Context, prefix string) ([]string, error) {
	if prefix != "" && !strings.HasSuffix(prefix, "/") {
		prefix += "/"
	}
	var out []string
	p := s3.NewListObjectsV2Paginator(s.client, &s3.ListObjectsV2Input{Bucket: aws.String(s.bucket), Prefix: aws.String(prefix), Delimiter: aws.String("/")})
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			return out, fmt.Errorf("listing s3://%s/%s: %w", s.bucket, prefix, err)
		}
		for _, c := range page.CommonPrefixes {
			out = append(out, strings.TrimSuffix(strings.TrimPrefix(aws.ToString(c.Prefix), prefix), "/"))
		}
	}
	return out, nil
}

// Get reads one object, for readers and tests.
func (s *S3) Get(ctx context.Context, key string) ([]byte, error) {
	o, err := s.client.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(s.bucket), Key: aws.String(key)})
	if err != nil {
		return nil, fmt.Errorf("s3://%s/%s: %w", s.bucket, key, err)
	}
	defer o.Body.Close()
	var b bytes.Buffer
	if _, err := b.ReadFrom(o.Body); err != nil {
		return nil, fmt.Errorf("s3://%s/%s: %w", s.bucket, key, err)
	}
	return b.Bytes(), nil
}
