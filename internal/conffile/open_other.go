//go:build !unix

package conffile

// openFlags: named pipes block no open(2) here.
const openFlags = 0
