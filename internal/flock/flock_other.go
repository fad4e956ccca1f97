//go:build !unix

package flock

import (
	"errors"
	"os"
)

func lock(*os.File) error {
	return errors.New("flock: file locks need a Unix system")
}
