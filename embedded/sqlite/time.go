package sqlite

import (
	"database/sql"
	"time"
)

// TimeLayout is how every store writes a time: UTC, fixed width, so that text
// order is time order.
const TimeLayout = "2006-01-02T15:04:05.000Z"

// FormatTime writes t as stores keep it.
func FormatTime(t time.Time) string { return t.UTC().Format(TimeLayout) }

// ParseTime reads a time as stores keep it.
func ParseTime(s string) (time.Time, error) { return time.Parse(TimeLayout, s) }

// ParseNullTime reads a time that may be NULL; NULL is nil.
func ParseNullTime(s sql.NullString) (*time.Time, error) {
	if !s.Valid {
		return nil, nil
	}
	t, err := ParseTime(s.String)
	if err != nil {
		return nil, err
	}
	return &t, nil
}
