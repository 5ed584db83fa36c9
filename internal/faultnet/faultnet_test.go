package faultnet

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"testing"
	"time"
)

// echo serves an echo server on loopback until the test ends.
func echo(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(c, c); c.Close() }()
		}
	}()
	return ln.Addr().String()
}

func proxy(t *testing.T) *Proxy {
	t.Helper()
	p, err := Listen(echo(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func dial(t *testing.T, p *Proxy) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(30 * time.Second)) // bounds a broken test, asserts nothing
	return c, bufio.NewReader(c)
}

func roundTrip(t *testing.T, c net.Conn, r *bufio.Reader, line string) {
	t.Helper()
	if _, err := io.WriteString(c, line+"\n"); err != nil {
		t.Fatalf("write %q: %v", line, err)
	}
	got, err := r.ReadString('\n')
	if err != nil || got != line+"\n" {
		t.Fatalf("echo of %q: %q %v", line, got, err)
	}
}

// TestCutAndHeal: a cut closes the connections through the link and
// every new one; after Heal a new connection goes through.
func TestCutAndHeal(t *testing.T) {
	p := proxy(t)
	c, r := dial(t, p)
	roundTrip(t, c, r, "before")
	p.Cut()
	if _, err := r.ReadString('\n'); err == nil {
		t.Fatal("a connection through a cut link stays open")
	}
	c2, r2 := dial(t, p)
	io.WriteString(c2, "during\n")
	if got, err := r2.ReadString('\n'); err == nil {
		t.Fatalf("a connection made through a cut link echoed %q", got)
	}
	p.Heal()
	c3, r3 := dial(t, p)
	roundTrip(t, c3, r3, "after")
}

// TestBlackholeDropsAndKeepsTheConnection: what is sent while the link is
// a black hole never arrives, and the connection carries what is sent
// after Heal.
func TestBlackholeDropsAndKeepsTheConnection(t *testing.T) {
	p := proxy(t)
	c, r := dial(t, p)
	roundTrip(t, c, r, "before")
	p.Blackhole()
	io.WriteString(c, "lost\n")
	for deadline := time.Now().Add(30 * time.Second); p.Swallowed.Load() < int64(len("lost\n")); {
		if time.Now().After(deadline) {
			t.Fatalf("the black hole swallowed %d bytes; want the 5 of \"lost\\n\"", p.Swallowed.Load())
		}
		time.Sleep(time.Millisecond)
	}
	p.Heal()
	roundTrip(t, c, r, "after")
}

// TestDelayKeepsOrder: a delayed link passes every byte, in order.
func TestDelayKeepsOrder(t *testing.T) {
	p := proxy(t)
	p.Delay(time.Millisecond)
	c, r := dial(t, p)
	want := bytes.Repeat([]byte("0123456789abcdef"), 1<<14) // 256 KiB, several chunks
	go c.Write(want)
	got := make([]byte, len(want))
	if _, err := io.ReadFull(r, got); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("through a delayed link: %v, equal %v", err, bytes.Equal(got, want))
	}
}
