//go:build unix

package main

import "syscall"

// openFilesLimit is how many descriptors the process may open (RLIMIT_NOFILE's soft limit, which
// Go raises to the hard one as it starts).
func openFilesLimit() (uint64, bool) {
	var files syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &files); err != nil {
		return 0, false
	}
	return files.Cur, true
}
