// Opens a signed note with golang.org/x/mod/sumdb/note, the reference implementation of C2SP
// signed notes, and prints what it verified. Used by tests/ledger/test_go_note.py.
//
// Usage: go_note VKEY NOTE_FILE
// Prints one JSON object: {"text": ..., "verified": [names], "unverified": [names]}; exits 1 when
// note.Open refuses the note.
package main

import (
	"encoding/json"
	"fmt"
	"os"

	"golang.org/x/mod/sumdb/note"
)

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: go_note VKEY NOTE_FILE")
		os.Exit(2)
	}
	verifier, err := note.NewVerifier(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, "bad verifier key:", err)
		os.Exit(2)
	}
	data, err := os.ReadFile(os.Args[2])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	n, err := note.Open(data, note.VerifierList(verifier))
	if err != nil {
		fmt.Fprintln(os.Stderr, "note.Open:", err)
		os.Exit(1)
	}
	out := map[string]interface{}{"text": n.Text, "verified": []string{}, "unverified": []string{}}
	verified := []string{}
	for _, s := range n.Sigs {
		verified = append(verified, s.Name)
	}
	unverified := []string{}
	for _, s := range n.UnverifiedSigs {
		unverified = append(unverified, s.Name)
	}
	out["verified"] = verified
	out["unverified"] = unverified
	if err := json.NewEncoder(os.Stdout).Encode(out); err != nil {
		os.Exit(2)
	}
}
