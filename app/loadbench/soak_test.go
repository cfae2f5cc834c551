package loadbench

import (
	"bytes"
	"database/sql"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	_ "modernc.org/sqlite"
)

// storeBytes is what a store holds, in bytes of live pages (its file less
// its free pages), and the rows of each table, read through a read-only
// handle of this (other) process.
func storeBytes(t *testing.T, path string) (int64, map[string]int64) {
	db, err := sql.Open("sqlite", "file:"+path+"?mode=ro&_pragma=busy_timeout(10000)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var pages, free, size int64
	db.QueryRow(`PRAGMA page_count`).Scan(&pages)
	db.QueryRow(`PRAGMA freelist_count`).Scan(&free)
	db.QueryRow(`PRAGMA page_size`).Scan(&size)
	rows := map[string]int64{}
	names, _ := db.Query(`SELECT name FROM sqlite_master WHERE type = 'table'`)
	var tables []string
	for names.Next() {
		var n string
		names.Scan(&n)
		tables = append(tables, n)
	}
	names.Close()
	for _, tb := range tables {
		var n int64
		db.QueryRow(`SELECT count(*) FROM "` + tb + `"`).Scan(&n)
		rows[tb] = n
	}
	return (pages - free) * size, rows
}

// TestSoak is 'make soak': hosts beat fast against the real binaries for a
// while, and what the stores grow by is measured, per beat and per table,
// then said per host per day at 10-second beats (issue 11, item 3). Set
// MESH_SOAK_HOSTS, MESH_SOAK_MINUTES and MESH_SOAK_BEAT to change the run.
func TestSoak(t *testing.T) {
	if os.Getenv("MESH_SOAK") == "" {
		t.Skip("the soak runs from 'make soak' (MESH_SOAK=1)")
	}
	hosts := envInt("MESH_SOAK_HOSTS", 1000)
	minutes := envInt("MESH_SOAK_MINUTES", 5)
	beat, err := time.ParseDuration(envOr("MESH_SOAK_BEAT", "1s"))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	mc := build(t, dir, "./cmd/mesh-controller", "mesh-controller")
	mh := build(t, dir, "./cmd/mesh-host", "mesh-host")
	c := newController(t, mc)
	c.serve()
	defer c.stop()
	tokens := filepath.Join(c.data, "tokens.txt")
	c.run("token", "issue", "--new", "h", "--count", strconv.Itoa(hosts), "--out", tokens)
	sim := exec.Command(mh, "simulate", "--broker", c.url, "--tokens", tokens, "--heartbeat", beat.String(), "--report", "1h", "--json")
	var simOut bytes.Buffer
	sim.Stdout = &simOut
	if err := sim.Start(); err != nil {
		t.Fatal(err)
	}
	stores := []string{"inventory", "identity", "health", "secrets"}
	measure := func() (int64, map[string]int64) {
		var total int64
		all := map[string]int64{}
		for _, s := range stores {
			b, rows := storeBytes(t, filepath.Join(c.data, s+".db"))
			total += b
			for k, v := range rows {
				all[s+"."+k] = v
			}
		}
		return total, all
	}
	// Joined and beating first; then the window.
	within := time.Duration(hosts/100+60) * time.Second
	if n := c.untilBeating(hosts, beat, within); n < hosts {
		t.Fatalf("%d of %d hosts beat every %s after %s", n, hosts, beat, within)
	}
	before, rowsBefore := measure()
	start := time.Now()
	fmt.Printf("\nsoak: %d hosts beating every %s for %d minutes\n", hosts, beat, minutes)
	for i := 1; i <= minutes; i++ {
		time.Sleep(time.Minute)
		b, _ := measure()
		fmt.Printf("  minute %d: stores %s (+%d bytes)\n", i, mib(b), b-before)
	}
	window := time.Since(start)
	sim.Process.Signal(os.Interrupt)
	sim.Wait()
	c.stop() // writes what it absorbed, the hourly aggregates included
	after, rowsAfter := measure()
	var stats struct {
		BeatsSent int64 `json:"beats_sent"`
	}
	json.Unmarshal(simOut.Bytes(), &stats)
	beats := float64(hosts) * window.Seconds() / beat.Seconds()
	grown := after - before
	perBeat := float64(grown) / beats
	fmt.Printf("\n  beats in the window: about %.0f (sent in all: %d)\n", beats, stats.BeatsSent)
	fmt.Printf("  stores grew by %d bytes: %.3f bytes per beat\n", grown, perBeat)
	for k, v := range rowsAfter {
		if d := v - rowsBefore[k]; d != 0 {
			fmt.Printf("    %-32s %+d rows\n", k, d)
		}
	}
	// Beats update rows in place; what a host adds with time is its hourly
	// aggregate row (and nothing else, as the row counts above show). One
	// host's day at any beat interval is 24 of those rows.
	added := rowsAfter["health.heartbeat_hours"] - rowsBefore["health.heartbeat_hours"]
	if added <= 0 {
		t.Fatalf("no hourly aggregate was written")
	}
	perRow := float64(grown) / float64(added)
	fmt.Printf("  one host: 24 hourly aggregate rows a day, %.0f bytes each with its index: %.0f bytes a day (kept 7 days: %.0f bytes)\n\n",
		perRow, 24*perRow, 7*24*perRow)
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
