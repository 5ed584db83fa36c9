//go:build unix

package conffile

import "syscall"

// openFlags keeps open(2) from waiting for a writer when the path turns
// out to be a named pipe.
const openFlags = syscall.O_NONBLOCK
