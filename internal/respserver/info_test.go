package respserver

import "testing"

func TestGitSHA1(t *testing.T) {
	for _, tc := range []struct{ revision, sha1, dirty string }{
		{"0123456789abcdef0123456789abcdef01234567", "01234567", "0"},
		{"0123456789abcdef0123456789abcdef01234567-dirty", "01234567", "1"},
		{"0123456789ab", "01234567", "0"}, // a pseudo-version's
		{"", "00000000", "0"},
		{"release-7", "00000000", "0"}, // stamped, not a commit
	} {
		if sha1, dirty := gitSHA1(tc.revision); sha1 != tc.sha1 || dirty != tc.dirty {
			t.Errorf("gitSHA1(%q) = %s, %s; want %s, %s", tc.revision, sha1, dirty, tc.sha1, tc.dirty)
		}
	}
}

func TestHumanBytes(t *testing.T) {
	for n, want := range map[int64]string{0: "0B", 1023: "1023B", 1024: "1.00K", 1536: "1.50K", 20 << 20: "20.00M", 3 << 30: "3.00G", 5 << 40: "5.00T", 7 << 50: "7.00P"} {
		if got := HumanBytes(n); got != want {
			t.Errorf("HumanBytes(%d) = %q, want %q", n, got, want)
		}
	}
}
