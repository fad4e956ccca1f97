// Package atomicfile replaces a file whole: a reader sees the old content
// or the new, never part of it, and a crash leaves one of the two.
package atomicfile

import (
	"os"
	"path/filepath"
)

// Write writes data to a new file beside path (mode 0600), syncs it and
// renames it over path.
func Write(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // after a successful rename, there is none
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
