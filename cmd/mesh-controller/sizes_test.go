package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// Every input has a size bound, said in its error, and what could never be
// delivered is refused before anything is recorded (issue 11, item 11):
// before, a 50 MB manifest was registered (722 MB of memory) and a module
// with 300,000 data sets was assigned though its declaration could never
// cross the broker.
func TestInputs_SizeBounds(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin := buildBinary(t)
	data, work := t.TempDir(), t.TempDir()
	run := func(args ...string) (string, string, int) {
		cmd := exec.Command(bin, append([]string{"--data", data}, args...)...)
		cmd.Dir = work
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return stdout.String(), stderr.String(), code
	}
	write := func(name string, b []byte) string {
		p := filepath.Join(work, name)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	manifest := func(module string, sets, pathLen int) []byte {
		var b strings.Builder
		fmt.Fprintf(&b, `{"module": %q, "version": "1.0.0", "data": [`, module)
		for i := 0; i < sets; i++ {
			if i > 0 {
				b.WriteString(",")
			}
			fmt.Fprintf(&b, `{"name": "d%d", "path": "/srv/%s/%s/%d", "precious": "rebuildable"}`, i, module, strings.Repeat("p", pathLen), i)
		}
		b.WriteString("]}")
		return []byte(b.String())
	}
	if _, _, code := run("migrate"); code != 0 {
		t.Fatal("migrate")
	}

	big := write("big.json", append(manifest("big", 1, 1), bytes.Repeat([]byte(" "), 2<<20)...))
	for _, cmd := range [][]string{{"module", "check", big}, {"module", "add", big}} {
		stdout, stderr, code := run(cmd...)
		if code != 1 || !strings.Contains(stdout+stderr, "bytes, and a manifest may be at most 1.0 MiB") {
			t.Fatalf("%v: exit %d: %s", cmd, code, stderr)
		}
	}
	many := write("many.json", manifest("many", 1001, 1))
	if stdout, stderr, code := run("module", "check", many); code != 1 || !strings.Contains(stdout+stderr, "data: 1001 entries, at most 1000") {
		t.Fatalf("1001 data sets: exit %d: %s", code, stderr)
	}
	decl := write("decl.json", append([]byte(`{"modules": []}`), bytes.Repeat([]byte(" "), 5<<20)...))
	run("node", "add", "web1")
	if _, stderr, code := run("declare", "web1", decl, "--why", "test"); code != 1 || !strings.Contains(stderr, "a declaration may be at most 4.0 MiB") {
		t.Fatalf("a 5 MiB declaration: exit %d: %s", code, stderr)
	}

	// Five modules each within bounds, together too heavy to declare.
	var names []string
	for i := 0; i < 5; i++ {
		name := fmt.Sprintf("heavy%d", i)
		if _, stderr, code := run("module", "add", write(name+".json", manifest(name, 1000, 900))); code != 0 {
			t.Fatalf("add %s: %s", name, stderr)
		}
		names = append(names, name)
	}
	_, stderr, code := run(append([]string{"assign", "web1"}, names...)...)
	if code != 1 || !strings.Contains(stderr, "web1's declaration would be") || !strings.Contains(stderr, "it could never be delivered") {
		t.Fatalf("assign: exit %d: %s", code, stderr)
	}
	if out, _, _ := run("plan", "web1"); !strings.Contains(out, "runs nothing from the mesh") {
		t.Fatalf("a refused assign recorded something: %s", out)
	}
}
