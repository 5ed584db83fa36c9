//go:build unix

package main

import (
	"math"
	"syscall"
)

// raiseFDLimit raises the soft open-file limit (RLIMIT_NOFILE) to the hard
// one, as Redis does at start, and returns the limit the process now runs
// with and the soft limit it found. Go's runtime already raises the soft
// limit to one below the hard limit before main runs (since Go 1.19), so
// "was" is usually that; doing it here makes the limit explicit and logged.
// When the raise fails the lower limit stays and is returned.
func raiseFDLimit() (now, was int, err error) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0, 0, err
	}
	was = clampInt(lim.Cur)
	if lim.Cur < lim.Max {
		want := syscall.Rlimit{Cur: lim.Max, Max: lim.Max}
		// An unlimited hard limit is refused above the kernel's nr_open;
		// then the soft limit stays where it is.
		_ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &want)
		if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
			return 0, 0, err
		}
	}
	return clampInt(lim.Cur), was, nil
}

// clampInt keeps an unlimited (RLIM_INFINITY) limit within an int32, which
// is more descriptors than any kernel gives a process.
func clampInt(v uint64) int {
	return int(min(v, math.MaxInt32))
}
