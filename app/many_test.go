package app

import (
	"context"
	"strings"
	"testing"
)

// A declare to a hundred nodes or more keeps how long its parts took
// (durations --kind declare: plan, sign, store, send); one to fewer keeps
// nothing.
func TestMany_DeclareTimesKept(t *testing.T) {
	c := plannedMesh(t, 100, 1, 5)
	ctx := context.Background()
	if _, err := c.Push(ctx, PushRequest{Node: "n1"}); err != nil {
		t.Fatal(err)
	}
	if ds, _ := c.Durations(ctx, "declare", 1); len(ds) != 0 {
		t.Fatalf("a push to one node kept %+v", ds)
	}
	pushed, err := c.Push(ctx, PushRequest{})
	if err != nil || len(pushed) != 100 {
		t.Fatalf("push --all: %d %v", len(pushed), err)
	}
	ds, err := c.Durations(ctx, "declare", 1)
	if err != nil {
		t.Fatal(err)
	}
	var parts []string
	for _, d := range ds {
		parts = append(parts, d.Subject)
	}
	if strings.Join(parts, ",") != "plan,send,sign,store" {
		t.Fatalf("declare parts: %v", parts)
	}
}
