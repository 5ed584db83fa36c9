// Package earlyhup makes SIGHUP harmless from the first moments of the
// process: its default action ends the process, and main can register
// for it only after every package is initialized, which takes tens of
// milliseconds (gRPC, protobuf descriptors, Prometheus). Imported by
// main, it is initialized as soon as os/signal is (Go initializes the
// packages whose imports are ready in the order of their import paths,
// and this one needs nothing else), and ignores SIGHUP until main's
// signal.Notify takes it over. A SIGHUP ignored then asks for nothing:
// sluice reads its files after main starts.
//
// A SIGHUP sent before the Go runtime has installed its signal handlers
// (about the first millisecond) still ends the process: no code of the
// program runs before then.
package earlyhup

import (
	"os/signal"
	"syscall"
)

func init() {
	signal.Ignore(syscall.SIGHUP)
}
