package app

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"strings"
)

// MaxNodesAtOnce bounds how many nodes one command names, and how many
// token issue --count makes.
const MaxNodesAtOnce = 100000

// Why a list of node names is refused.
var (
	// ErrNoNodes means a list of node names named none.
	ErrNoNodes = errors.New("names no node")
	// ErrTooManyNodes means a list names more nodes than one command takes.
	ErrTooManyNodes = fmt.Errorf("names more than %d nodes", MaxNodesAtOnce)
	// ErrNamedTwice means a list names a node twice.
	ErrNamedTwice = errors.New("is named twice")
)

// ReadNodeNames reads node names one a line, as 'node remove --nodes' and
// 'assign --nodes' take them. A line may also be a 'name token' line as
// 'token issue --count --out' writes them: its first word is the name.
// Blank lines and lines starting with # are skipped. A name that is not
// valid, or given twice, is refused with its line number; so is a list of
// none, or of more than MaxNodesAtOnce.
func ReadNodeNames(r io.Reader, from string) ([]string, error) {
	sc := bufio.NewScanner(r)
	var names []string
	first := map[string]int{}
	line := 0
	for sc.Scan() {
		line++
		text := strings.TrimSpace(sc.Text())
		if text == "" || strings.HasPrefix(text, "#") {
			continue
		}
		name := strings.Fields(text)[0]
		if err := CheckName(name); err != nil {
			return nil, fmt.Errorf("%s line %d: %w", from, line, err)
		}
		if at, ok := first[name]; ok {
			return nil, fmt.Errorf("%s line %d: %s %w (first on line %d)", from, line, name, ErrNamedTwice, at)
		}
		if len(names) == MaxNodesAtOnce {
			return nil, fmt.Errorf("%s %w (line %d is one too many)", from, ErrTooManyNodes, line)
		}
		first[name] = line
		names = append(names, name)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s line %d: %w", from, line+1, err)
	}
	if len(names) == 0 {
		return nil, fmt.Errorf("%s %w", from, ErrNoNodes)
	}
	return names, nil
}
