package main

import (
	"strings"
	"testing"
)

const sampleMountinfo = `22 1 254:0 / / rw,relatime - ext4 /dev/vda rw,discard
35 22 0:31 / /var/lib rw,relatime - tmpfs tmpfs rw,size=48m
36 35 7:3 / /var/lib/sluice rw,relatime shared:7 master:1 - ext4 /dev/loop3 rw
37 22 8:16 / /srv/with\040space rw,relatime - ext4 /dev/sdb rw,errors=remount-ro
38 22 8:32 / /srv/panic rw - ext4 /dev/sdc rw,errors=panic
39 22 8:48 / /srv/xfs rw - xfs /dev/sdd rw,attr2
40 22 8:64 / /srv/cont rw - ext4 /dev/sde rw,errors=continue
41 22 8:80 / /srv/panic rw - ext4 /dev/sdf rw
`

// TestFindMount: the mount holding a path is the longest mount point above
// it, the latest of several on one point, with mountinfo's escapes undone.
func TestFindMount(t *testing.T) {
	for _, c := range []struct{ path, point, source string }{
		{"/home/x", "/", "/dev/vda"},
		{"/var/lib/sluice/data", "/var/lib/sluice", "/dev/loop3"},
		{"/var/lib/sluice", "/var/lib/sluice", "/dev/loop3"},
		{"/var/lib/sluice-data", "/var/lib", "tmpfs"},
		{"/srv/with space/data", "/srv/with space", "/dev/sdb"},
		{"/srv/panic/data", "/srv/panic", "/dev/sdf"}, // mounted over /dev/sdc
	} {
		m, ok := findMount(strings.NewReader(sampleMountinfo), c.path)
		if !ok || m.point != c.point || m.source != c.source {
			t.Errorf("findMount(%q) = %+v, %v; want %s on %s", c.path, m, ok, c.source, c.point)
		}
	}
	if m, ok := parseMountinfo("36 35 7:3 / /x rw shared:7"); ok {
		t.Errorf("a line without the - separator parsed as %+v", m)
	}
}

// TestCheckVolume: ext4 that carries on after errors (by mount option, or
// by its superblock's default, or by mkfs's default when the device cannot
// be read) and loop devices are warned about; ext4 that stops at its first
// error, on a real device, and other filesystems are not.
func TestCheckVolume(t *testing.T) {
	unread := func(string) string { return "" }
	for _, c := range []struct {
		path     string
		defaults func(string) string
		want     []string // a word of each warning, in order
	}{
		{"/srv/cont/data", unread, []string{"errors=continue"}},
		{"/srv/with space/data", unread, nil},
		{"/srv/xfs/data", unread, nil},
		{"/home/x", unread, []string{"errors=continue"}}, // no errors=, device unreadable: mkfs's default
		{"/home/x", func(string) string { return "remount-ro" }, nil},
		{"/home/x", func(string) string { return "continue" }, []string{"errors=continue"}},
		{"/var/lib/sluice/data", func(string) string { return "remount-ro" }, []string{"loop device"}},
		{"/var/lib/sluice/data", unread, []string{"errors=continue", "loop device"}},
	} {
		m, _ := findMount(strings.NewReader(sampleMountinfo), c.path)
		ws := checkVolume(m, c.defaults, func(int) string { return "/var/lib/img" })
		if len(ws) != len(c.want) {
			t.Errorf("%s: %d warnings, want %d: %+v", c.path, len(ws), len(c.want), ws)
			continue
		}
		for i, w := range ws {
			if !strings.Contains(w.msg, c.want[i]) || !strings.Contains(w.msg, "docs/operations.md") {
				t.Errorf("%s: warning %d is %q, want one about %s pointing at the docs", c.path, i, w.msg, c.want[i])
			}
		}
	}
}
