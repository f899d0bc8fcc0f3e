//go:build !linux

package pgtest

import (
	"errors"
	"fmt"
)

// mountDisk: a disk of fixed size is a Linux tmpfs mount here (StartOnSmallDisk skips without).
func mountDisk(string, int) error {
	return fmt.Errorf("pgtest: a tmpfs mount: %w", errors.ErrUnsupported)
}

func unmountDisk(string) error { return nil }
