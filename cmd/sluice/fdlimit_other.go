//go:build !unix

package main

import "errors"

// raiseFDLimit reports that this system has no RLIMIT_NOFILE to read.
func raiseFDLimit() (now, was int, err error) {
	return 0, 0, errors.New("no RLIMIT_NOFILE on this system")
}
