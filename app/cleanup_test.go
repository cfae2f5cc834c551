package app

import (
	"strings"
	"testing"
	"time"
)

// The digest is over exactly what a preview shows: the same preview gives
// the same digest, and each field shown changes it.
func TestCleanup_DigestIsOverThePreview(t *testing.T) {
	n := int64(4096)
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	base := Cleanable{Node: "web1", Module: "paperless", Target: "media", Kind: "data", Path: "/var/lib/paperless/media", Precious: "irreplaceable",
		Bytes: &n, LastBackup: &at, Since: at, AgeDays: 3, Why: "unassigned"}
	d := previewDigest(base)
	if len(d) != 12 || strings.Trim(d, "0123456789abcdef") != "" {
		t.Fatalf("digest %q is not 12 hex characters", d)
	}
	// What is not previewed (age, why, since) does not move it.
	same := base
	same.AgeDays, same.Why, same.Since = 40, "other", at.Add(time.Hour)
	if previewDigest(same) != d {
		t.Fatal("a field that is not previewed changed the digest")
	}
	more, later, removed := int64(4097), at.Add(time.Second), at
	for name, change := range map[string]func(*Cleanable){
		"node": func(c *Cleanable) { c.Node = "web2" }, "module": func(c *Cleanable) { c.Module = "other" },
		"target": func(c *Cleanable) { c.Target = "index" }, "kind": func(c *Cleanable) { c.Kind = "consumer" },
		"path": func(c *Cleanable) { c.Path = "/srv" }, "precious": func(c *Cleanable) { c.Precious = "costly" },
		"size": func(c *Cleanable) { c.Bytes = &more }, "size unknown": func(c *Cleanable) { c.Bytes = nil },
		"a backup since": func(c *Cleanable) { c.LastBackup = &later }, "never backed up": func(c *Cleanable) { c.LastBackup = nil },
		"its node removed": func(c *Cleanable) { c.NodeRemovedAt = &removed },
	} {
		c := base
		change(&c)
		if previewDigest(c) == d {
			t.Errorf("%s did not change the digest", name)
		}
	}
}
