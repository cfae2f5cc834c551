package app

import (
	"fmt"
	"strings"
)

// ProblemsError refuses a command as a whole and lists every problem found,
// not only the first.
type ProblemsError struct {
	// What was refused, e.g. "assign web1 paperless postgres".
	What     string
	Problems []string
	// Unknown are the names it was given that name nothing (a module not
	// registered, a node not known), each also among the problems: the
	// refusal is then first theirs, and the HTTP API answers 404 Not Found
	// rather than 409 Conflict.
	Unknown []string
}

func (e *ProblemsError) Error() string {
	return e.Summary() + ": " + strings.Join(e.Problems, "; ")
}

// Summary is the refusal without the problems: what, and how many.
func (e *ProblemsError) Summary() string {
	return fmt.Sprintf("%s refused, %s", e.What, Plural(len(e.Problems), "problem"))
}

// Details are the problems, one a line.
func (e *ProblemsError) Details() []string { return e.Problems }

func refuse(what string, problems []string) error {
	if len(problems) == 0 {
		return nil
	}
	return &ProblemsError{What: what, Problems: problems}
}

// Plural counts nouns as a person writes them: "1 problem", "2 problems",
// "0 problems". It is for nouns that take a plain "s".
func Plural[N ~int | ~int64](n N, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

// isAre counts nouns and gives the verb that agrees: "1 secret is", "2 secrets are".
func isAre[N ~int | ~int64](n N, noun string) string {
	if n == 1 {
		return Plural(n, noun) + " is"
	}
	return Plural(n, noun) + " are"
}
