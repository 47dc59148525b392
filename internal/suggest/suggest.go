// Package suggest finds the name a user most likely meant, for "did you
// mean" hints on unknown flags, config keys and rules keys.
package suggest

import "strings"

// Closest returns the candidate nearest to word in edit distance, if it is
// close: at most 1 edit for words of up to 4 bytes, 2 for longer ones, with
// case, _ and - not counted; "" if none is. Ties go to the first candidate.
func Closest(word string, candidates []string) string {
	w := fold(word)
	best, bestD := "", -1
	for _, c := range candidates {
		if d := editDistance(w, fold(c)); bestD < 0 || d < bestD {
			best, bestD = c, d
		}
	}
	limit := 2
	if len(word) <= 4 {
		limit = 1
	}
	if bestD < 0 || bestD > limit {
		return ""
	}
	return best
}

// fold makes the spellings Closest does not count the same: lower case, _
// as -.
func fold(s string) string { return strings.ReplaceAll(strings.ToLower(s), "_", "-") }

// editDistance is the Levenshtein distance between a and b, in bytes.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
