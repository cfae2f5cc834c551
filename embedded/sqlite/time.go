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

// ParseTime reads a time as stores keep it: the same time time.Parse
// gives with TimeLayout, read directly when s is well formed (a listing of
// 10,000 nodes reads 30,000 of them; BenchmarkParseTime), by time.Parse
// otherwise, whose error says what is wrong.
func ParseTime(s string) (time.Time, error) {
	if t, ok := parseFixed(s); ok {
		return t, nil
	}
	return time.Parse(TimeLayout, s)
}

// parseFixed reads s if it is exactly TimeLayout's shape with every field
// in range; false leaves it to time.Parse.
func parseFixed(s string) (time.Time, bool) {
	if len(s) != len(TimeLayout) || s[4] != '-' || s[7] != '-' || s[10] != 'T' || s[13] != ':' || s[16] != ':' || s[19] != '.' || s[23] != 'Z' {
		return time.Time{}, false
	}
	num := func(from, to int) int {
		n := 0
		for i := from; i < to; i++ {
			c := s[i]
			if c < '0' || c > '9' {
				return -1
			}
			n = n*10 + int(c-'0')
		}
		return n
	}
	year, month, day, hour, minute, sec, ms := num(0, 4), num(5, 7), num(8, 10), num(11, 13), num(14, 16), num(17, 19), num(20, 23)
	if year < 0 || month < 1 || month > 12 || day < 1 || hour < 0 || hour > 23 || minute < 0 || minute > 59 || sec < 0 || sec > 59 || ms < 0 {
		return time.Time{}, false
	}
	t := time.Date(year, time.Month(month), day, hour, minute, sec, ms*int(time.Millisecond), time.UTC)
	if t.Day() != day { // the 31st of a 30-day month, say: time.Parse refuses it
		return time.Time{}, false
	}
	return t, true
}

// Seconds is SQL for the seconds from the time earlier to the time later,
// both SQL expressions of times as stores keep them: the one computation on
// time that each engine spells its own way.
func (db *DB) Seconds(later, earlier string) string {
	if db.Postgres {
		return "extract(epoch FROM (CAST(" + later + " AS timestamptz) - CAST(" + earlier + " AS timestamptz)))"
	}
	return "(julianday(" + later + ") - julianday(" + earlier + ")) * 86400"
}

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
