package pgtest

import (
	"fmt"
	"syscall"
)

// mountDisk mounts a tmpfs of size bytes on dir (StartOnSmallDisk).
func mountDisk(dir string, size int) error {
	return syscall.Mount("pixlimit-pg", dir, "tmpfs", 0, fmt.Sprintf("size=%d,mode=0700", size))
}

// unmountDisk detaches what mountDisk mounted, at once, even if a file in it is still open.
func unmountDisk(dir string) error { return syscall.Unmount(dir, syscall.MNT_DETACH) }
