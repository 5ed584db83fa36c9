package sluicetest

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"
)

// Serve answers RESP commands on 127.0.0.1:0 with reply(command name and
// arguments), a raw RESP reply such as "-ERR store unavailable: ...\r\n",
// and returns the address. It stands for a server that answers what a test
// needs, such as error texts a real sluice gives only in rare states.
func Serve(t testing.TB, reply func(args []string) string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		conns []net.Conn
	)
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					args, err := readCommand(r)
					if err != nil {
						return
					}
					if _, err := io.WriteString(c, reply(args)); err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String()
}

// readCommand reads one RESP array of bulk strings.
func readCommand(r *bufio.Reader) ([]string, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return nil, err
	}
	if len(line) < 3 || line[0] != '*' {
		return nil, io.ErrUnexpectedEOF
	}
	n, err := strconv.Atoi(line[1 : len(line)-2])
	if err != nil {
		return nil, err
	}
	args := make([]string, 0, n)
	for range n {
		line, err := r.ReadString('\n')
		if err != nil {
			return nil, err
		}
		size, err := strconv.Atoi(line[1 : len(line)-2])
		if err != nil {
			return nil, err
		}
		b := make([]byte, size+2)
		if _, err := io.ReadFull(r, b); err != nil {
			return nil, err
		}
		args = append(args, string(b[:size]))
	}
	return args, nil
}

// isHello reports whether the command in p, "*N\r\n$5\r\nHELLO\r\n...",
// is HELLO.
func isHello(p []byte) bool {
	i := bytes.Index(p, []byte("\r\n$5\r\n"))
	return i >= 0 && len(p) >= i+11 && bytes.EqualFold(p[i+6:i+11], []byte("HELLO"))
}

// Conn is an in-memory net.Conn for go-redis' Dialer that answers every
// command written to it with Reply (and HELLO with an error), without
// parsing it further: a transport that
// costs next to nothing, for benchmarks that must leave sluice out.
// go-redis writes each command with one Write and reads its reply before
// sending the next one on the same connection.
type Conn struct {
	Reply []byte

	mu     sync.Mutex
	cond   *sync.Cond
	buf    []byte
	off    int
	closed bool
}

// NewConn returns a Conn that answers reply to every command.
func NewConn(reply string) *Conn {
	c := &Conn{Reply: []byte(reply)}
	c.cond = sync.NewCond(&c.mu)
	return c
}

// Write takes one command and queues its reply.
func (c *Conn) Write(p []byte) (int, error) {
	c.mu.Lock()
	if c.off == len(c.buf) {
		c.buf, c.off = c.buf[:0], 0
	}
	if isHello(p) {
		// go-redis opens every connection with HELLO and falls back to
		// RESP2 when it is refused.
		c.buf = append(c.buf, "-ERR unknown command 'HELLO'\r\n"...)
	} else {
		c.buf = append(c.buf, c.Reply...)
	}
	c.mu.Unlock()
	c.cond.Signal()
	return len(p), nil
}

// Read returns queued replies, waiting for one if there is none.
func (c *Conn) Read(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for c.off == len(c.buf) && !c.closed {
		c.cond.Wait()
	}
	if c.closed {
		return 0, net.ErrClosed
	}
	n := copy(p, c.buf[c.off:])
	c.off += n
	return n, nil
}

// Close makes reads fail.
func (c *Conn) Close() error {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	c.cond.Broadcast()
	return nil
}

func (c *Conn) LocalAddr() net.Addr              { return fakeAddr{} }
func (c *Conn) RemoteAddr() net.Addr             { return fakeAddr{} }
func (c *Conn) SetDeadline(time.Time) error      { return nil }
func (c *Conn) SetReadDeadline(time.Time) error  { return nil }
func (c *Conn) SetWriteDeadline(time.Time) error { return nil }

type fakeAddr struct{}

func (fakeAddr) Network() string { return "fake" }
func (fakeAddr) String() string  { return "fake" }
