//go:build !unix

package main

// openFilesLimit: no descriptor limit this package reads (Windows bounds its handles otherwise).
func openFilesLimit() (uint64, bool) { return 0, false }
