package objstore

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"keyway/internal/poll"
	"keyway/internal/s3test"
)

// The sink on a real S3-compatible server (SeaweedFS, path-style through
// AWS_ENDPOINT_URL): segments are listed under the layout's prefixes and
// read back whole and in order; an outage (the server frozen while
// segments are cut) loses nothing.
func TestSinkOnS3(t *testing.T) {
	srv := s3test.Start(t)
	srv.CreateBucket(t, "trail")
	t.Setenv("AWS_ENDPOINT_URL", srv.Endpoint)
	t.Setenv("AWS_ACCESS_KEY_ID", "test")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "test")
	t.Setenv("AWS_REGION", "us-east-1")
	ctx := context.Background()
	store, err := NewS3(ctx, "trail", true)
	if err != nil {
		t.Fatal(err)
	}
	cfg := testSinkConfig()
	cfg.PutTimeout = 2 * time.Second
	s, _, stop := startSink(t, cfg, store)
	var want []string
	write := func(from, to int) {
		for i := from; i < to; i++ {
			want = append(want, fmt.Sprintf(`{"seq":%d,"i":%d}`, i+1, i))
			s.Write("orders", []byte(fmt.Sprintf(`{"i":%d}`, i)))
		}
	}
	write(0, 100)
	poll.Until(t, 30*time.Second, "the first segments uploaded", func() bool { return s.Uploaded() > 0 })
	srv.Stop()
	write(100, 200)
	poll.Until(t, 30*time.Second, "segments spooled during the outage", func() bool { return s.Spooled() > 0 })
	srv.Resume()
	write(200, 300)
	poll.Until(t, 60*time.Second, "every segment uploaded", func() bool { return s.Spooled() == 0 && s.Uploaded() >= 3 })
	stop()
	keys, err := store.List(ctx, "keyway/")
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(keys)
	var got []string
	for _, k := range keys {
		set, run, _, err := ParseKey("keyway", k)
		if err != nil || set != "orders" || run != "r1" {
			t.Fatalf("key %q: %q %q %v", k, set, run, err)
		}
		b, err := store.Get(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")...)
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") || s.Dropped() != 0 {
		t.Fatalf("read back %d lines in %d segments (dropped %d), want the %d written in order", len(got), len(keys), s.Dropped(), len(want))
	}
	t.Logf("%d events in %d segments, through an outage", len(got), len(keys))
}
