package policy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
)

// ParseJSON parses a rule file in JSON syntax:
// {"overrides": [rule, ...], "default": rule}. name is the file name for
// error messages. A non-nil error is a *ValidationError.
//
// Decoding is strict: unknown or repeated members are errors, operation
// values must be strings, creditLimit, resetSeconds, burst, minGapMillis and
// maxQuota must be written as non-negative integers (not 1.5, 1e3 or "3"),
// and stagger as true or false (not "true"). A null member is the same as
// a missing one. "default" may be left out only if the last override has an
// empty operation.
func ParseJSON(name string, data []byte) (*Policy, error) {
	j := &jsonFile{name: name, data: bytes.TrimPrefix(data, []byte("\uFEFF"))}
	var top json.RawMessage
	if err := json.Unmarshal(j.data, &top); err != nil {
		var syn *json.SyntaxError
		if errors.As(err, &syn) {
			return nil, j.fail(int(syn.Offset)-1, "", "invalid JSON: %v", err)
		}
		return nil, j.fail(0, "", "invalid JSON: %v", err)
	}
	topOff := len(j.data) - len(bytes.TrimLeft(j.data, " \t\r\n"))
	ms, err := j.members(top, topOff, "", "the file")
	if err != nil {
		return nil, err
	}
	var overrides, def *member
	for i := range ms {
		switch m := &ms[i]; m.name {
		case "overrides":
			overrides = m
		case "default":
			def = m
		default:
			return nil, j.fail(m.off, "", "unknown field %q; the fields are overrides and default", m.name)
		}
	}
	var rules []Rule
	if overrides != nil && !isNull(overrides.raw) {
		if overrides.raw[0] != '[' {
			return nil, j.fail(overrides.off, "", "overrides is %s; expected an array of rules", overrides.raw)
		}
		dec := json.NewDecoder(bytes.NewReader(overrides.raw))
		if _, err := dec.Token(); err != nil {
			return nil, j.fail(overrides.off, "", "invalid JSON: %v", err)
		}
		for dec.More() {
			var raw json.RawMessage
			if err := dec.Decode(&raw); err != nil {
				return nil, j.fail(overrides.off, "", "invalid JSON: %v", err)
			}
			off := overrides.off + int(dec.InputOffset()) - len(raw)
			r, err := j.rule(raw, off, len(rules)+1, false)
			if err != nil {
				return nil, err
			}
			rules = append(rules, r)
		}
	}
	if def != nil && !isNull(def.raw) {
		r, err := j.rule(def.raw, def.off, len(rules)+1, true)
		if err != nil {
			return nil, err
		}
		rules = append(rules, r)
	}
	return newPolicy(name, rules)
}

type jsonFile struct {
	name string
	data []byte
}

// member is one member of a JSON object; off is where its value starts in
// the file.
type member struct {
	name string
	raw  json.RawMessage
	off  int
}

func isNull(raw []byte) bool { return string(raw) == "null" }

// line returns the line of byte offset off in the file.
func (j *jsonFile) line(off int) int {
	return 1 + bytes.Count(j.data[:max(0, min(off, len(j.data)))], []byte{'\n'})
}

func (j *jsonFile) fail(off int, rule, format string, args ...any) *ValidationError {
	return &ValidationError{File: j.name, Line: j.line(off), Rule: rule, Problem: fmt.Sprintf(format, args...)}
}

// members lists the members of the object raw, which starts at off in the
// file, rejecting repeated names. raw is valid JSON.
func (j *jsonFile) members(raw []byte, off int, rule, what string) ([]member, error) {
	if raw[0] != '{' {
		return nil, j.fail(off, rule, "%s is %s; expected an object", what, raw)
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	if _, err := dec.Token(); err != nil {
		return nil, j.fail(off, rule, "invalid JSON: %v", err)
	}
	var ms []member
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return nil, j.fail(off, rule, "invalid JSON: %v", err)
		}
		m := member{name: t.(string)}
		if err := dec.Decode(&m.raw); err != nil {
			return nil, j.fail(off, rule, "invalid JSON: %v", err)
		}
		m.off = off + int(dec.InputOffset()) - len(m.raw)
		for _, o := range ms {
			if o.name == m.name {
				return nil, j.fail(m.off, rule, "%s has %q twice", what, m.name)
			}
		}
		ms = append(ms, m)
	}
	return ms, nil
}

// rule decodes one rule object. The default rule may leave out its
// operation.
func (j *jsonFile) rule(raw []byte, off, pos int, isDefault bool) (Rule, error) {
	r := &Rule{Operation: []Pair{}, Pos: pos, File: j.name, Line: j.line(off)}
	ms, err := j.members(raw, off, fmt.Sprintf("rule %d", pos), "a rule")
	if err != nil {
		return Rule{}, err
	}
	// The operation first, so that messages about the other fields show it.
	hasOp := false
	for _, m := range ms {
		if m.name != "operation" || isNull(m.raw) {
			continue
		}
		hasOp = true
		ops, err := j.members(m.raw, m.off, fmt.Sprintf("rule %d", pos), "operation")
		if err != nil {
			return Rule{}, err
		}
		for _, o := range ops {
			var v string
			if o.raw[0] != '"' || json.Unmarshal(o.raw, &v) != nil {
				return Rule{}, j.fail(o.off, fmt.Sprintf("rule %d", pos), "operation value of %q is %s; expected a string", o.name, o.raw)
			}
			r.Operation = append(r.Operation, Pair{Key: o.name, Value: v})
		}
	}
	if !hasOp && !isDefault {
		return Rule{}, r.fail(0, "operation is missing; expected an object of strings")
	}
	fs := fieldSet{r: r, lines: map[string]int{}}
	for _, m := range ms {
		var problem string
		fs.lines[m.name] = j.line(m.off)
		switch {
		case m.name == "operation":
		case !knownField(m.name) || (isCount(m.name) || isBool(m.name)) && !isNull(m.raw):
			problem = fs.set(m.name, string(m.raw))
		case isNull(m.raw):
		case m.raw[0] == '"':
			var s string
			if err := json.Unmarshal(m.raw, &s); err != nil {
				problem = fmt.Sprintf("%s: %v", m.name, err)
				break
			}
			problem = fs.set(m.name, s)
		default:
			problem = fmt.Sprintf("%s is %s; expected a string", m.name, m.raw)
		}
		if problem != "" {
			return Rule{}, r.fail(j.line(m.off), "%s", problem)
		}
	}
	if field, problem := fs.finish(); problem != "" {
		return Rule{}, r.fail(fs.line(field), "%s", problem)
	}
	return *r, nil
}
