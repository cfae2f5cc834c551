package app

import (
	"encoding/json"
	"io"
	"math"
	"strconv"
	"time"
)

// WriteNodesJSON writes nodes exactly as WriteJSON does, byte for byte
// (TestWriteNodesJSON holds it to that), without reflection and without
// indenting a compact document afterwards: at 10,000 nodes that was half
// of what node list --json cost (BenchmarkPrintNodesJSON).
// It is node list --json and GET /v1/nodes.
func WriteNodesJSON(w io.Writer, nodes []NodeView) error {
	if len(nodes) == 0 {
		_, err := io.WriteString(w, "[]\n")
		return err
	}
	b := make([]byte, 0, 400*len(nodes))
	b = append(b, "[\n"...)
	var err error
	for i, n := range nodes {
		if i > 0 {
			b = append(b, ",\n"...)
		}
		b = append(b, "  {\n    \"name\": "...)
		b = appendJSONString(b, n.Name)
		b = append(b, ",\n    \"mode\": "...)
		b = appendJSONString(b, n.Mode)
		b = append(b, ",\n    \"joined\": "...)
		b = strconv.AppendBool(b, n.Joined)
		b = append(b, ",\n    \"joined_at\": "...)
		if b, err = appendJSONTimeOrNull(b, n.JoinedAt); err != nil {
			return err
		}
		b = append(b, ",\n    \"last_heard\": "...)
		if b, err = appendJSONTimeOrNull(b, n.LastHeard); err != nil {
			return err
		}
		b = append(b, ",\n    \"created_at\": "...)
		if b, err = appendJSONTime(b, n.CreatedAt); err != nil {
			return err
		}
		b = append(b, ",\n    \"serial_declared\": "...)
		b = strconv.AppendInt(b, n.SerialDeclared, 10)
		b = append(b, ",\n    \"serial_applied\": "...)
		b = strconv.AppendInt(b, n.SerialApplied, 10)
		b = append(b, ",\n    \"behind\": "...)
		b = strconv.AppendBool(b, n.Behind)
		if n.BehindWhy != "" {
			b = append(b, ",\n    \"behind_why\": "...)
			b = appendJSONString(b, n.BehindWhy)
		}
		b = append(b, ",\n    \"heartbeat_interval_s\": "...)
		if b, err = appendJSONFloat(b, n.HeartbeatS); err != nil {
			return err
		}
		b = append(b, ",\n    \"last_apply\": "...)
		if a := n.LastApply; a == nil {
			b = append(b, "null"...)
		} else {
			b = append(b, "{\n      \"serial\": "...)
			b = strconv.AppendInt(b, a.Serial, 10)
			b = append(b, ",\n      \"ok\": "...)
			b = strconv.AppendBool(b, a.OK)
			if a.Error != "" {
				b = append(b, ",\n      \"error\": "...)
				b = appendJSONString(b, a.Error)
			}
			b = append(b, ",\n      \"total_ms\": "...)
			if b, err = appendJSONFloat(b, a.TotalMS); err != nil {
				return err
			}
			b = append(b, ",\n      \"at\": "...)
			if b, err = appendJSONTime(b, a.At); err != nil {
				return err
			}
			b = append(b, "\n    }"...)
		}
		if a := n.Applying; a != nil {
			b = append(b, ",\n    \"applying\": {\n      \"serial\": "...)
			b = strconv.AppendInt(b, a.Serial, 10)
			b = append(b, ",\n      \"since\": "...)
			if b, err = appendJSONTime(b, a.Since); err != nil {
				return err
			}
			if a.Phase != "" {
				b = append(b, ",\n      \"phase\": "...)
				b = appendJSONString(b, a.Phase)
			}
			b = append(b, "\n    }"...)
		}
		if n.HostVersion != "" {
			b = append(b, ",\n    \"host_version\": "...)
			b = appendJSONString(b, n.HostVersion)
		}
		if n.Protocol != "" {
			b = append(b, ",\n    \"protocol\": "...)
			b = appendJSONString(b, n.Protocol)
		}
		if n.HostRelease != "" {
			b = append(b, ",\n    \"host_release\": "...)
			b = appendJSONString(b, n.HostRelease)
		}
		b = append(b, "\n  }"...)
	}
	b = append(b, "\n]\n"...)
	_, err = w.Write(b)
	return err
}

// appendJSONString appends s as encoding/json writes it (escaping <, > and
// & as it does by default): plain printable ASCII directly, anything else
// through encoding/json itself.
func appendJSONString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			q, _ := json.Marshal(s) // a string always marshals
			return append(b, q...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}

// appendJSONTime appends t as time.Time's MarshalJSON does.
func appendJSONTime(b []byte, t time.Time) ([]byte, error) {
	if y := t.Year(); y < 0 || y > 9999 {
		q, err := t.MarshalJSON() // its error says why
		return append(b, q...), err
	}
	b = append(b, '"')
	b = t.AppendFormat(b, time.RFC3339Nano)
	return append(b, '"'), nil
}

func appendJSONTimeOrNull(b []byte, t *time.Time) ([]byte, error) {
	if t == nil {
		return append(b, "null"...), nil
	}
	return appendJSONTime(b, *t)
}

// appendJSONFloat appends f as encoding/json does: without an exponent from
// 1e-6 up to 1e21, through encoding/json itself otherwise.
func appendJSONFloat(b []byte, f float64) ([]byte, error) {
	if abs := math.Abs(f); abs == 0 || abs >= 1e-6 && abs < 1e21 {
		return strconv.AppendFloat(b, f, 'f', -1, 64), nil
	}
	q, err := json.Marshal(f)
	return append(b, q...), err
}
