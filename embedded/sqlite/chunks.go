package sqlite

import "strings"

// ChunkSize is how many values one IN (...) list holds: far below
// SQLite's limit on parameters, and enough that a hundred thousand names
// take a few hundred statements rather than one each.
const ChunkSize = 500

// InChunks calls fn for each chunk of values with the placeholders of an
// IN list ("?, ?, ?") and the values as arguments, so a statement about
// many names is written once and run a few times.
func InChunks(values []string, fn func(marks string, args []any) error) error {
	for start := 0; start < len(values); start += ChunkSize {
		chunk := values[start:min(start+ChunkSize, len(values))]
		args := make([]any, len(chunk))
		for i, v := range chunk {
			args[i] = v
		}
		if err := fn(strings.TrimSuffix(strings.Repeat("?, ", len(chunk)), ", "), args); err != nil {
			return err
		}
	}
	return nil
}
