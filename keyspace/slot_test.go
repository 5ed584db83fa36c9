package keyspace

import "testing"

// TestSlot checks slots against the values Redis Cluster's specification
// and CLUSTER KEYSLOT give.
func TestSlot(t *testing.T) {
	for _, c := range []struct {
		key  string
		slot uint16
	}{
		{"123456789", 12739}, // the CRC16-XMODEM check value 0x31C3, mod 16384
		{"", 0},
		{"foo", 12182},
		{"bar", 5061},
		{"user1000", 3443},
		{"{user1000}.following", 3443},
		{"{user1000}.followers", 3443},
		{"foo{}{bar}", Slot([]byte("foo{}{bar}"))},
		{"foo{{bar}}zap", Slot([]byte("{bar"))},
		{"foo{bar}{zap}", Slot([]byte("bar"))},
		{"{}", Slot([]byte("{}"))},
		{"abc{", Slot([]byte("abc{"))},
	} {
		if got := Slot([]byte(c.key)); got != c.slot {
			t.Errorf("Slot(%q) = %d, want %d", c.key, got, c.slot)
		}
	}
	if crc16([]byte("123456789")) != 0x31C3 {
		t.Errorf("crc16 check value = %#x, want 0x31c3", crc16([]byte("123456789")))
	}
}

func TestHashTag(t *testing.T) {
	for _, c := range []struct{ key, tag string }{
		{"foo", "foo"},
		{"{user1000}.following", "user1000"},
		{"foo{}{bar}", "foo{}{bar}"}, // the first tag is empty: the whole key
		{"foo{{bar}}zap", "{bar"},
		{"foo{bar}{zap}", "bar"},
		{"{", "{"},
		{"}{a}", "a"},
	} {
		if got := string(HashTag([]byte(c.key))); got != c.tag {
			t.Errorf("HashTag(%q) = %q, want %q", c.key, got, c.tag)
		}
	}
}

func BenchmarkSlot(b *testing.B) {
	k := []byte("ratelimit/user:123456/60")
	b.ReportAllocs()
	var s uint16
	for b.Loop() {
		s += Slot(k)
	}
	_ = s
}
