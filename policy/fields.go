package policy

import (
	"errors"
	"fmt"
	"math"
	"strconv"
)

// fieldSet collects one rule's fields, for both loaders.
type fieldSet struct {
	r     *Rule
	lines map[string]int  // the line of each field given (INI: also of nulls, for repeats)
	given map[string]bool // fields given a value (not null)
}

// fieldNames lists the fields in the order rule files and POLICY SHOW give
// them, for messages.
const fieldNames = "creditLimit, resetSeconds, algorithm, stagger, burst, minGapMillis, quotaField, maxQuota, actorField, matchPolicy, shadow, label and comment"

// set assigns a field from its text and returns the problem, if any.
func (f *fieldSet) set(name, text string) (problem string) {
	switch name {
	case "creditLimit":
		f.r.CreditLimit, problem = parseCount(name, text)
	case "resetSeconds":
		f.r.ResetSeconds, problem = parseCount(name, text)
	case "algorithm":
		f.r.Algorithm, problem = parseAlgorithm(text)
	case "stagger":
		f.r.Stagger, problem = parseBool(name, text)
	case "burst":
		f.r.Burst, problem = parseCount(name, text)
	case "minGapMillis":
		f.r.MinGapMillis, problem = parseCount(name, text)
	case "quotaField":
		f.r.QuotaField = text
	case "maxQuota":
		f.r.MaxQuota, problem = parseCount(name, text)
	case "actorField":
		f.r.ActorField = text
	case "matchPolicy":
		f.r.MatchPolicy, problem = parseMatchPolicy(text)
	case "shadow":
		f.r.Shadow, problem = parseBool(name, text)
	case "label":
		f.r.Label = text
		if text != "" && !validLabel(text) {
			problem = fmt.Sprintf("label %q does not match ^[a-zA-Z0-9_-]{1,255}$", text)
		}
	case "comment":
		f.r.Comment = text
	default:
		return fmt.Sprintf("unknown field %q; the fields are %s", name, fieldNames)
	}
	if f.given == nil {
		f.given = make(map[string]bool)
	}
	// An empty string field is the same as leaving it out.
	f.given[name] = problem == "" && (text != "" || isCount(name) || isBool(name))
	return problem
}

func knownField(name string) bool {
	switch name {
	case "creditLimit", "resetSeconds", "algorithm", "stagger", "burst", "minGapMillis", "quotaField", "maxQuota",
		"actorField", "matchPolicy", "shadow", "label", "comment":
		return true
	}
	return false
}

// isCount reports whether a field is a non-negative integer: a JSON number.
func isCount(name string) bool {
	switch name {
	case "creditLimit", "resetSeconds", "burst", "minGapMillis", "maxQuota":
		return true
	}
	return false
}

// isBool reports whether a field is a boolean: JSON true or false.
func isBool(name string) bool { return name == "stagger" || name == "shadow" }

// finish checks the rule once all its fields are set, and returns the
// field the problem is about ("" for the rule as a whole) and the problem.
func (f *fieldSet) finish() (field, problem string) {
	switch {
	case !f.given["creditLimit"]:
		return "", "creditLimit is missing; expected a non-negative integer"
	case !f.given["resetSeconds"]:
		return "", "resetSeconds is missing; expected a non-negative integer"
	}
	return f.checkAlgorithm()
}

// line is the line of field, or 0 (the rule's line) when it is "".
func (f *fieldSet) line(field string) int {
	if field == "" {
		return 0
	}
	return f.lines[field]
}

// parseCount reads an integer field: decimal digits with an optional minus
// sign, which is then rejected.
func parseCount(name, text string) (int64, string) {
	n, err := strconv.ParseInt(text, 10, 64)
	switch {
	case text == "":
		return 0, name + " is empty; expected a non-negative integer"
	case errors.Is(err, strconv.ErrRange) && text[0] != '-' && text[0] != '+':
		return 0, fmt.Sprintf("%s is %s: out of range; expected at most %d", name, text, int64(math.MaxInt64))
	case err != nil || text[0] == '+' || n < 0:
		return 0, fmt.Sprintf("%s is %s; expected a non-negative integer", name, text)
	}
	return n, ""
}

// parseBool reads a boolean field: true or false, as JSON writes them.
func parseBool(name, text string) (bool, string) {
	switch text {
	case "":
		return false, name + " is empty; expected true or false"
	case "true":
		return true, ""
	case "false":
		return false, ""
	}
	return false, fmt.Sprintf("%s is %s; expected true or false", name, text)
}
