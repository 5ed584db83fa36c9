package main

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// The data directory's volume is checked once at start for the two setups
// under which fsynced data has been lost with no error to anyone (see
// docs/operations.md, "Volumes that keep acknowledged writes"): ext4 that
// carries on after I/O errors, and a loop device, whose kernel driver
// reports a write that reached its backing file only in part as done when
// the filesystem holding that file fills. Neither stops sluice: they are
// warnings an operator can act on before the volume fills.

// mount is what /proc/self/mountinfo says of one mount.
type mount struct {
	point  string // where it is mounted
	major  int    // the device's numbers (loop devices are major 7)
	minor  int
	fsType string
	source string   // the device, such as /dev/sdb or /dev/loop3
	super  []string // the filesystem's own options, such as errors=continue
}

// loopMajor is the device major number of Linux loop devices.
const loopMajor = 7

// findMount returns the mount that holds path (absolute, symbolic links
// resolved) in the mountinfo text r: the one with the longest mount point
// above path, the latest mounted if several share it.
func findMount(r io.Reader, path string) (mount, bool) {
	var best mount
	found := false
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		m, ok := parseMountinfo(sc.Text())
		if !ok || !under(path, m.point) {
			continue
		}
		if !found || len(m.point) >= len(best.point) {
			best, found = m, true
		}
	}
	return best, found
}

// parseMountinfo parses one line of /proc/self/mountinfo:
//
//	36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue
//
// (proc(5)): a variable number of optional fields ends at "-".
func parseMountinfo(line string) (mount, bool) {
	f := strings.Fields(line)
	sep := -1
	for i := 6; i < len(f); i++ {
		if f[i] == "-" {
			sep = i
			break
		}
	}
	if len(f) < 5 || sep < 0 || len(f) < sep+4 {
		return mount{}, false
	}
	maj, min, ok := strings.Cut(f[2], ":")
	if !ok {
		return mount{}, false
	}
	var m mount
	var err1, err2 error
	m.major, err1 = strconv.Atoi(maj)
	m.minor, err2 = strconv.Atoi(min)
	if err1 != nil || err2 != nil {
		return mount{}, false
	}
	m.point = unescapeMount(f[4])
	m.fsType = f[sep+1]
	m.source = unescapeMount(f[sep+2])
	m.super = strings.Split(f[sep+3], ",")
	return m, true
}

// unescapeMount undoes the octal escapes mountinfo writes for space, tab,
// newline and backslash in paths.
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// under reports whether path is point or lies below it.
func under(path, point string) bool {
	if point == "/" || path == point {
		return true
	}
	return strings.HasPrefix(path, point+"/")
}

// option returns the value of the filesystem option name ("errors") in m,
// and whether it is set.
func (m mount) option(name string) (string, bool) {
	for _, o := range m.super {
		if v, ok := strings.CutPrefix(o, name+"="); ok {
			return v, true
		}
	}
	return "", false
}

// ext4 superblock fields (at byte 1024 of the device): s_magic at 0x38,
// s_errors at 0x3C (1 continue, 2 remount-ro, 3 panic).
const (
	extSuperblock = 1024
	extMagic      = 0xEF53
)

var extErrors = map[uint16]string{1: "continue", 2: "remount-ro", 3: "panic"}

// extDefaultErrors reads the error behaviour an ext2/3/4 filesystem uses
// when mounted without errors=, from its superblock on device; "" when the
// device cannot be read (as in most containers).
func extDefaultErrors(device string) string {
	f, err := os.Open(device)
	if err != nil {
		return ""
	}
	defer f.Close()
	var sb [0x3E]byte
	if _, err := f.ReadAt(sb[:], extSuperblock); err != nil {
		return ""
	}
	if binary.LittleEndian.Uint16(sb[0x38:]) != extMagic {
		return ""
	}
	return extErrors[binary.LittleEndian.Uint16(sb[0x3C:])]
}

// volumeWarning is one thing found wrong with the data directory's volume.
type volumeWarning struct {
	msg   string
	attrs []any
}

// checkVolume returns what is unsafe about the volume holding m, given
// how to read an ext filesystem's default error behaviour and a loop
// device's backing file.
func checkVolume(m mount, defaultErrors func(device string) string, backing func(minor int) string) []volumeWarning {
	var ws []volumeWarning
	if m.fsType == "ext2" || m.fsType == "ext3" || m.fsType == "ext4" {
		behaviour, set := m.option("errors")
		source := "mount option"
		if !set {
			behaviour, source = defaultErrors(m.source), "filesystem default"
			if behaviour == "" {
				behaviour, source = "continue", "filesystem default, unread: mkfs.ext4 sets continue unless told otherwise; tune2fs -l "+m.source+" shows it"
			}
		}
		if behaviour == "continue" {
			ws = append(ws, volumeWarning{
				msg:   "the data directory's filesystem carries on after I/O errors (errors=continue); remount it with errors=remount-ro, so that it stops at its first write error instead of going on with what it lost (docs/operations.md, Volumes that keep acknowledged writes)",
				attrs: []any{"mount", m.point, "device", m.source, "fs", m.fsType, "errors", behaviour, "from", source},
			})
		}
	}
	if m.major == loopMajor {
		attrs := []any{"mount", m.point, "device", m.source}
		if b := backing(m.minor); b != "" {
			attrs = append(attrs, "backing_file", b)
		}
		ws = append(ws, volumeWarning{
			msg:   "the data directory is on a loop device: when the filesystem holding its backing file fills, Linux reports writes that reached that file only in part as done, and fsynced tables are lost with no error (measured); keep the backing filesystem from filling, or use a block device (docs/operations.md, Volumes that keep acknowledged writes)",
			attrs: attrs,
		})
	}
	return ws
}

// loopBacking returns the backing file of loop device minor, or "".
func loopBacking(minor int) string {
	b, err := os.ReadFile(fmt.Sprintf("/sys/dev/block/%d:%d/loop/backing_file", loopMajor, minor))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// warnAboutVolume logs what is unsafe about the volume that holds (or will
// hold) the data directory dir. Anything it cannot read is skipped
// silently: the check is advice, not a condition of starting.
func warnAboutVolume(dir string, log *slog.Logger) {
	path, err := filepath.Abs(dir)
	if err != nil {
		return
	}
	// The directory may not exist yet: its nearest existing parent is on
	// the same volume.
	for {
		if real, err := filepath.EvalSymlinks(path); err == nil {
			path = real
			break
		}
		parent := filepath.Dir(path)
		if parent == path {
			return
		}
		path = parent
	}
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return
	}
	defer f.Close()
	m, ok := findMount(f, path)
	if !ok {
		return
	}
	for _, w := range checkVolume(m, extDefaultErrors, loopBacking) {
		log.Warn(w.msg, append([]any{"dir", dir}, w.attrs...)...)
	}
}
