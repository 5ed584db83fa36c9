package policy

import (
	"fmt"
	"strconv"
)

// fieldSet collects one rule's fields, for both loaders.
type fieldSet struct {
	r                   *Rule
	lines               map[string]int // INI: the line of each field given
	hasCredit, hasReset bool
}

// set assigns a field from its text and returns the problem, if any.
func (f *fieldSet) set(name, text string) (problem string) {
	switch name {
	case "creditLimit":
		f.r.CreditLimit, problem = parseCount(name, text)
		f.hasCredit = true
	case "resetSeconds":
		f.r.ResetSeconds, problem = parseCount(name, text)
		f.hasReset = true
	case "actorField":
		f.r.ActorField = text
	case "matchPolicy":
		f.r.MatchPolicy, problem = parseMatchPolicy(text)
	case "label":
		f.r.Label = text
		if text != "" && !validLabel(text) {
			problem = fmt.Sprintf("label %q does not match ^[a-zA-Z0-9_-]{1,255}$", text)
		}
	case "comment":
		f.r.Comment = text
	default:
		problem = fmt.Sprintf("unknown field %q; the fields are creditLimit, resetSeconds, actorField, matchPolicy, label and comment", name)
	}
	return problem
}

func knownField(name string) bool {
	switch name {
	case "creditLimit", "resetSeconds", "actorField", "matchPolicy", "label", "comment":
		return true
	}
	return false
}

func isCount(name string) bool { return name == "creditLimit" || name == "resetSeconds" }

func (f *fieldSet) missing() string {
	switch {
	case !f.hasCredit:
		return "creditLimit is missing; expected a non-negative integer"
	case !f.hasReset:
		return "resetSeconds is missing; expected a non-negative integer"
	}
	return ""
}

// parseCount reads creditLimit or resetSeconds: decimal digits with an
// optional minus sign, which is then rejected.
func parseCount(name, text string) (int64, string) {
	n, err := strconv.ParseInt(text, 10, 64)
	switch {
	case text == "":
		return 0, name + " is empty; expected a non-negative integer"
	case err != nil || text[0] == '+' || n < 0:
		return 0, fmt.Sprintf("%s is %s; expected a non-negative integer", name, text)
	}
	return n, ""
}
