package policy

import (
	"fmt"
	"strings"
)

// ParseINI parses a rule file in INI syntax. name is the file name for
// error messages. A non-nil error is a *ValidationError.
func ParseINI(name string, data []byte) (*Policy, error) {
	var rules []Rule
	var cur *fieldSet
	fail := func(line int, rule, format string, args ...any) error {
		return &ValidationError{File: name, Line: line, Rule: rule, Problem: fmt.Sprintf(format, args...)}
	}
	finish := func() error {
		if cur == nil {
			return nil
		}
		if field, problem := cur.finish(); problem != "" {
			return cur.r.fail(cur.line(field), "%s", problem)
		}
		rules = append(rules, *cur.r)
		return nil
	}
	text := strings.TrimPrefix(string(data), "\uFEFF")
	for i, line := range strings.Split(text, "\n") {
		n := i + 1
		t := strings.Trim(line, " \t\r")
		switch {
		case t == "" || t[0] == '#' || t[0] == ';':
		case t[0] == '[':
			if err := finish(); err != nil {
				return nil, err
			}
			pos := len(rules) + 1
			op, problem := parseHeader(t)
			if problem != "" {
				return nil, fail(n, fmt.Sprintf("rule %d", pos), "header %s: %s", t, problem)
			}
			cur = &fieldSet{r: &Rule{Operation: op, Pos: pos, File: name, Line: n}, lines: map[string]int{}}
		case cur == nil:
			return nil, fail(n, "", "%q is outside any rule; a rule starts with a [header]", t)
		default:
			key, val, ok := strings.Cut(t, "=")
			if !ok {
				return nil, cur.r.fail(n, "expected \"field = value\" or a [header], found %q", t)
			}
			key = strings.TrimRight(key, " \t")
			if first, dup := cur.lines[key]; dup {
				return nil, cur.r.fail(n, "%s is given twice (first on line %d)", key, first)
			}
			cur.lines[key] = n
			val, quoted, problem := unquoteINI(strings.TrimLeft(val, " \t"))
			if problem == "" && (quoted || val != "null") {
				problem = cur.set(key, val)
			}
			if problem != "" {
				return nil, cur.r.fail(n, "%s", problem)
			}
		}
	}
	if err := finish(); err != nil {
		return nil, err
	}
	return newPolicy(name, rules)
}

// unquoteINI strips one pair of matching quotes, ' or ". quoted tells an
// unquoted null, which stands for a field left out, from a quoted one.
func unquoteINI(v string) (s string, quoted bool, problem string) {
	if v == "" || (v[0] != '\'' && v[0] != '"') {
		return v, false, ""
	}
	if len(v) < 2 || v[len(v)-1] != v[0] {
		return "", false, fmt.Sprintf("value %s has no closing %c", v, v[0])
	}
	return v[1 : len(v)-1], true, ""
}

// parseHeader reads a section header, already trimmed, into an operation.
// The header is everything between the first `[` and the last `]`, so a `]`
// may appear in a value. Tokens are key=value separated by spaces or tabs;
// a key or value may be quoted with ' or " (no escape), and then may hold
// anything but its quote. An unquoted key runs to `=`; an unquoted value
// runs to white space and may not contain `=`.
func parseHeader(t string) ([]Pair, string) {
	if !strings.HasSuffix(t, "]") {
		return nil, "expected ] at the end of the line"
	}
	s := strings.Trim(t[1:len(t)-1], " \t")
	switch s {
	case "":
		return nil, "empty header; the default rule is [default]"
	case "default":
		return []Pair{}, ""
	}
	var op []Pair
	for s != "" {
		key, rest, problem := headerString(s, true)
		if problem != "" {
			return nil, problem
		}
		if !strings.HasPrefix(rest, "=") {
			token, _, _ := strings.Cut(strings.ReplaceAll(s, "\t", " "), " ")
			return nil, fmt.Sprintf("%q is not key=value", token)
		}
		var value string
		if value, rest, problem = headerString(rest[1:], false); problem != "" {
			return nil, problem
		}
		if rest != "" && rest[0] != ' ' && rest[0] != '\t' {
			return nil, fmt.Sprintf("expected white space after the value of %s, found %q", key, rest)
		}
		for _, p := range op {
			if p.Key == key {
				return nil, fmt.Sprintf("key %s appears twice", quoteINI(key))
			}
		}
		op = append(op, Pair{Key: key, Value: value})
		s = strings.TrimLeft(rest, " \t")
	}
	return op, ""
}

// headerString reads a quoted or unquoted key or value at the start of s.
func headerString(s string, isKey bool) (str, rest, problem string) {
	if s != "" && (s[0] == '\'' || s[0] == '"') {
		end := strings.IndexByte(s[1:], s[0])
		if end < 0 {
			return "", "", fmt.Sprintf("%s has no closing %c", s, s[0])
		}
		return s[1 : 1+end], s[2+end:], ""
	}
	end := strings.IndexAny(s, " \t")
	if end < 0 {
		end = len(s)
	}
	if !isKey {
		if strings.Contains(s[:end], "=") {
			return "", "", fmt.Sprintf("value %s contains '='; quote it", s[:end])
		}
		return s[:end], s[end:], ""
	}
	if eq := strings.IndexByte(s[:end], '='); eq >= 0 {
		end = eq
	}
	if end == 0 {
		return "", "", "empty key; quote it ('') if that is meant"
	}
	return s[:end], s[end:], ""
}
