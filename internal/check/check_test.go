package check

import "testing"

// TestAppendCleanPath: the path /check matches is the one the application
// most likely sees: escapes decoded but %2F, . and .. resolved, // merged,
// a trailing slash kept.
func TestAppendCleanPath(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"/orders", "/orders"},
		{"/%6Frders", "/orders"},
		{"/%6frders", "/orders"},
		{"//orders", "/orders"},
		{"/x/../orders", "/orders"},
		{"/./orders", "/orders"},
		{"/a/b/../../orders", "/orders"},
		{"/../../orders", "/orders"},
		{"/%2E%2E/orders", "/orders"},
		{"/x/%2e%2e/orders", "/orders"},
		{"/orders/", "/orders/"},
		{"/orders//", "/orders/"},
		{"/a/b/..", "/a/"},
		{"/a/.", "/a/"},
		{"/a%2Forders", "/a%2Forders"},
		{"/a%2forders", "/a%2Forders"},
		{"/a%2F..%2Forders", "/a%2F..%2Forders"}, // one segment, as Go's RawPath keeps it
		{"/bad%zzescape%", "/bad%zzescape%"},
		{"/trailing%4", "/trailing%4"},
		{"/sp%20ace", "/sp ace"},
		{"", "/"},
		{"/", "/"},
		{"orders", "/orders"},
		{"/..", "/"},
	} {
		got := string(appendCleanPath([]byte("x"), tc.in))
		if got != "x"+tc.want {
			t.Errorf("appendCleanPath(%q) = %q, want %q", tc.in, got[1:], tc.want)
		}
	}
	b := make([]byte, 0, 64)
	if n := testing.AllocsPerRun(100, func() { b = appendCleanPath(b[:0], "/x/../%6Frders//a/") }); n != 0 {
		t.Errorf("%v allocations", n)
	}
}
