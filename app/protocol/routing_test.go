package protocol

import (
	"errors"
	"strings"
	"testing"
)

func TestCheckDomain(t *testing.T) {
	label := strings.Repeat("a", 63)
	long := strings.Repeat(label+".", 3) + strings.Repeat("b", 61) // 253
	for _, ok := range []string{"example.org", "a.b", "mesh-1.example-2.net", "xn--bcher-kva.example", label + ".org", long, "1.example.org"} {
		if err := CheckDomain(ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	for _, bad := range []string{"", "org", "Example.org", "a_b.org", "-a.org", "a-.org", "a..org", ".a.org", "a.org.", label + "a.org", long + "b", "10.0.0.1", "a.b/c", "é.org"} {
		if err := CheckDomain(bad); !errors.Is(err, ErrBadDomain) {
			t.Errorf("%q: %v, want %v", bad, err, ErrBadDomain)
		}
	}
}

func TestCheckNetworks(t *testing.T) {
	got, err := CheckNetworks([]string{"2001:db8::/48", "192.168.0.0/24", "10.0.0.0/8", "10.0.0.0/8"})
	if !errors.Is(err, ErrNetworksOverlap) {
		t.Fatalf("the same network twice: %v, %v", got, err)
	}
	got, err = CheckNetworks([]string{"2001:db8::/48", "192.168.0.0/24", "10.0.0.0/8", "100.128.0.0/9", "fe80::/10"})
	if err != nil {
		t.Fatal(err)
	}
	var shown []string
	for _, p := range got {
		shown = append(shown, p.String())
	}
	if strings.Join(shown, " ") != "10.0.0.0/8 100.128.0.0/9 192.168.0.0/24 2001:db8::/48 fe80::/10" {
		t.Fatalf("sorted: %v", shown)
	}
	for _, c := range []struct {
		nets []string
		want error
	}{
		{[]string{"100.127.255.0/24"}, ErrOverlapsOverlay},
		{[]string{"64.0.0.0/2"}, ErrOverlapsOverlay},
		{[]string{"fdff::/16"}, ErrOverlapsOverlay},
		{[]string{"::/0"}, ErrOverlapsOverlay},
		{[]string{"10.0.0.1/8"}, ErrBadNetwork},
		{[]string{"2001:db8::1/48"}, ErrBadNetwork},
		{[]string{"10.0.0.0/33"}, ErrBadNetwork},
		{[]string{"2001:db8::/48", "2001:db8:0:1::/64"}, ErrNetworksOverlap},
	} {
		if _, err := CheckNetworks(c.nets); !errors.Is(err, c.want) {
			t.Errorf("%v: %v, want %v", c.nets, err, c.want)
		}
	}
	if _, err := CheckNetworks([]string{"10.0.0.1/8"}); err == nil || !strings.Contains(err.Error(), "the network is 10.0.0.0/8") {
		t.Errorf("a non-canonical network's error names the canonical one: %v", err)
	}
}
