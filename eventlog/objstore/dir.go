package objstore

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"keyway/internal/atomicfile"
)

// Dir is a Store and a Reader on a local directory holding the layout, a
// key's slashes being its directories: a copy of the bucket (aws s3 sync,
// mc mirror) reads like the bucket itself.
type Dir struct {
	Root string
}

// path maps a key to a file, refusing keys that would leave Root.
func (d Dir) path(key string) (string, error) {
	if key == "" || !filepath.IsLocal(filepath.FromSlash(key)) {
		return "", fmt.Errorf("%q is not a key under %s", key, d.Root)
	}
	return filepath.Join(d.Root, filepath.FromSlash(key)), nil
}

// Put writes body at key, atomically (a reader never sees half a
// segment).
func (d Dir) Put(_ context.Context, key string, body []byte) error {
	p, err := d.path(key)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return err
	}
	return atomicfile.Write(p, body)
}

// ListDirs returns the directories under prefix, sorted.
func (d Dir) ListDirs(_ context.Context, prefix string) ([]string, error) {
	p := d.Root
	if prefix = strings.Trim(prefix, "/"); prefix != "" {
		var err error
		if p, err = d.path(prefix); err != nil {
			return nil, err
		}
	}
	entries, err := os.ReadDir(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range entries {
		if e.IsDir() {
			out = append(out, e.Name())
		}
	}
	return out, nil
}

// List returns the keys of the files under prefix, sorted.
func (d Dir) List(_ context.Context, prefix string) ([]string, error) {
	var out []string
	start := d.Root
	if i := strings.LastIndexByte(prefix, '/'); i > 0 {
		var err error
		if start, err = d.path(prefix[:i]); err != nil {
			return nil, err
		}
	}
	err := filepath.WalkDir(start, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if !e.Type().IsRegular() {
			return nil
		}
		rel, err := filepath.Rel(d.Root, p)
		if err != nil {
			return err
		}
		if key := filepath.ToSlash(rel); strings.HasPrefix(key, prefix) {
			out = append(out, key)
		}
		return nil
	})
	slices.Sort(out)
	return out, err
}

// Get reads one object.
func (d Dir) Get(_ context.Context, key string) ([]byte, error) {
	p, err := d.path(key)
	if err != nil {
		return nil, err
	}
	return os.ReadFile(p)
}
