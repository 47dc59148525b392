package main

// The tests of this file keep the repository's Markdown honest.
//
//   - Every file of docs/examples is checked: rules files load (bad-*.yaml
//     must not), serve config files (serve*.yaml) pass
//     `freqring serve --config F --check-config`, cluster keys (*.keys)
//     and admin token files (*.token) read, and each is shown or named in some Markdown file.
//   - A fenced block right after <!-- file: PATH --> must be PATH's
//     content; a yaml block without it fails (examples live in files).
//   - A console block must follow <!-- doctest --> or
//     <!-- doctest: serve ARGS -->: its "$ " commands are run (freqring
//     in this process, curl and grpcurl emulated against the node that
//     the directive starts, on free ports) and what each prints must be
//     what the block shows after it, up to timestamps, unix-ms versions,
//     retry-after durations and column spacing (see normalize).
//   - Every freqring command line in sh and console blocks, and in inline
//     code, names an existing command and flags it defines.
//   - Relative links point to files and headings that exist; no Markdown
//     names paths outside the repository, issue numbers or seeds.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/freqring/freqring/rules"
)

// repoRoot is the repository's top directory, from cmd/freqring.
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// markdownFiles returns every .md file of the repository, relative to root.
func markdownFiles(t *testing.T, root string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && p != root && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || d.Name() == "build") {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(p, ".md") {
			rel, _ := filepath.Rel(root, p)
			out = append(out, rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// mdBlock is a fenced code block of a Markdown file.
type mdBlock struct {
	file      string // relative to the repository's root
	line      int    // of the opening fence, from 1
	info      string // the fence's info string: yaml, console, sh ...
	directive string // the <!-- ... --> comment on the line before it, if any
	body      string
}

func (b mdBlock) where() string { return fmt.Sprintf("%s:%d", b.file, b.line) }

var directiveRE = regexp.MustCompile(`^<!--\s*(.*?)\s*-->$`)

// codeBlocks returns the fenced blocks of a Markdown text.
func codeBlocks(file, text string) []mdBlock {
	var out []mdBlock
	lines := strings.Split(text, "\n")
	prev := ""
	for i := 0; i < len(lines); i++ {
		l := lines[i]
		if !strings.HasPrefix(l, "```") {
			if strings.TrimSpace(l) != "" {
				prev = strings.TrimSpace(l)
			}
			continue
		}
		b := mdBlock{file: file, line: i + 1, info: strings.TrimSpace(strings.TrimPrefix(l, "```"))}
		if m := directiveRE.FindStringSubmatch(prev); m != nil {
			b.directive = m[1]
		}
		var body []string
		for i++; i < len(lines) && !strings.HasPrefix(lines[i], "```"); i++ {
			body = append(body, lines[i])
		}
		b.body = strings.Join(body, "\n")
		out = append(out, b)
		prev = ""
	}
	return out
}

// TestDocExamples checks every file of docs/examples, and that a Markdown
// file shows or names it.
func TestDocExamples(t *testing.T) {
	root := repoRoot(t)
	t.Chdir(root)
	var allMD strings.Builder
	for _, f := range markdownFiles(t, root) {
		b, _ := os.ReadFile(f)
		allMD.Write(b)
	}
	ents, err := os.ReadDir(filepath.Join("docs", "examples"))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		name := e.Name()
		path := "docs/examples/" + name
		if !strings.Contains(allMD.String(), path) {
			t.Errorf("%s: no Markdown file shows or names it", path)
		}
		switch {
		case strings.HasSuffix(name, ".keys"):
			if _, err := gossipKeys(path); err != nil {
				t.Errorf("cluster keys file %v", err)
			}
		case strings.HasSuffix(name, ".token"):
			if _, err := readTokens(path); err != nil {
				t.Errorf("admin token file %v", err)
			}
		case !strings.HasSuffix(name, ".yaml"):
			t.Errorf("%s: not a kind of example this test checks (rules files, bad-*.yaml, serve*.yaml, *.keys, *.token)", path)
		case strings.HasPrefix(name, "serve"):
			if code, out, errOut := runCmd(context.Background(), "serve", "--config", path, "--check-config"); code != 0 || out != "configuration ok\n" {
				t.Errorf("freqring serve --config %s --check-config: exit %d\n%s%s", path, code, out, errOut)
			}
		case strings.HasPrefix(name, "bad-"):
			if _, err := rules.Load(path); err == nil {
				t.Errorf("%s: loads, but is named as a bad rules file", path)
			}
		default:
			if _, err := rules.Load(path); err != nil {
				t.Errorf("rules file %v", err)
			}
		}
	}
}

// TestDocBlocks checks the code blocks of every Markdown file: files shown
// are the files, console sessions print what they show, freqring command
// lines use flags that exist.
func TestDocBlocks(t *testing.T) {
	root := repoRoot(t)
	t.Chdir(root)
	for _, file := range markdownFiles(t, root) {
		text, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for _, b := range codeBlocks(file, string(text)) {
			switch {
			case strings.HasPrefix(b.directive, "file:"):
				path := strings.TrimSpace(strings.TrimPrefix(b.directive, "file:"))
				want, err := os.ReadFile(path)
				if err != nil {
					t.Errorf("%s: %v", b.where(), err)
				} else if strings.TrimRight(string(want), "\n") != strings.TrimRight(b.body, "\n") {
					t.Errorf("%s: the block differs from %s", b.where(), path)
				}
			case b.info == "yaml" || b.info == "yml":
				t.Errorf("%s: a yaml block must be a file of the repository, shown with <!-- file: PATH --> before it", b.where())
			}
			if b.info == "console" || b.info == "sh" {
				checkCommandFlags(t, b)
			}
			switch {
			case b.info == "console" && strings.HasPrefix(b.directive, "doctest"):
				t.Run(strings.ReplaceAll(b.where(), "/", "_"), func(t *testing.T) { runDoctest(t, b) })
			case b.info == "console":
				t.Errorf("%s: a console block (commands and what they print) must follow <!-- doctest --> or <!-- doctest: serve ARGS -->; commands alone go in an sh block", b.where())
			}
		}
	}
}

// commandLines returns the command lines of an sh or console block: in a
// console block the lines after "$ ", in an sh block every line that is
// not a comment; a line ending in \ continues on the next.
func commandLines(b mdBlock) []string {
	var out []string
	lines := strings.Split(b.body, "\n")
	for i := 0; i < len(lines); i++ {
		l := strings.TrimSpace(lines[i])
		if b.info == "console" {
			if !strings.HasPrefix(l, "$ ") {
				continue
			}
			l = strings.TrimPrefix(l, "$ ")
		} else if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		for strings.HasSuffix(l, `\`) && i+1 < len(lines) {
			i++
			l = strings.TrimSuffix(l, `\`) + " " + strings.TrimSpace(lines[i])
		}
		out = append(out, l)
	}
	return out
}

// checkCommandFlags checks that each freqring command line of b names a
// command and flags that exist.
func checkCommandFlags(t *testing.T, b mdBlock) {
	for _, line := range commandLines(b) {
		checkCommandLine(t, b.where(), line)
	}
}

// checkCommandLine checks that a freqring command line names a command and
// flags that exist; a placeholder (COMMAND, [flags], ...) is let be.
func checkCommandLine(t *testing.T, where, line string) {
	words, _, err := shellWords(line)
	if err != nil {
		t.Errorf("%s: %q: %v", where, line, err)
		return
	}
	if len(words) < 2 || words[0] != "freqring" || strings.ToLower(words[1]) != words[1] {
		return
	}
	cmd := words[1:2]
	if words[1] == "override" && len(words) > 2 {
		cmd = words[1:3]
	}
	switch words[1] {
	case "rules", "version", "help":
		return // no flags
	}
	if !slices.ContainsFunc(flagCommands, func(c []string) bool { return slices.Equal(c, cmd) }) {
		if words[1] == "override" && (len(cmd) < 2 || strings.Contains(cmd[1], "|") || strings.HasPrefix(cmd[1], "-")) {
			return // "override set|delete|list"
		}
		t.Errorf("%s: %q: no command freqring %s", where, line, strings.Join(cmd, " "))
		return
	}
	fset := commandFlags(t, cmd)
	for _, w := range words[1+len(cmd):] {
		if w == "--" {
			break
		}
		if !strings.HasPrefix(w, "-") || w == "-" {
			continue
		}
		name, _, _ := strings.Cut(strings.TrimLeft(w, "-"), "=")
		if fset.Lookup(name) == nil && name != "h" && name != "help" {
			t.Errorf("%s: %q: freqring %s has no flag --%s", where, line, strings.Join(cmd, " "), name)
		}
	}
}

var inlineCommandRE = regexp.MustCompile("`(freqring [^`]+)`")

// TestDocInlineCommands checks the freqring command lines in the
// Markdown's inline code, as TestDocBlocks does those of its blocks.
func TestDocInlineCommands(t *testing.T) {
	root := repoRoot(t)
	t.Chdir(root)
	for _, f := range markdownFiles(t, root) {
		b, _ := os.ReadFile(f)
		inFence := false
		for i, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, "```") {
				inFence = !inFence
			}
			if inFence {
				continue
			}
			for _, m := range inlineCommandRE.FindAllStringSubmatch(l, -1) {
				checkCommandLine(t, fmt.Sprintf("%s:%d", f, i+1), strings.ReplaceAll(m[1], `\|`, "|"))
			}
		}
	}
}

// shellWords splits a command line as sh would for the commands of the
// docs: single and double quotes, backslash escapes, # comments. It
// returns the words and what follows the command: "> /dev/null" (its
// output is thrown away) or "| jq ." (its JSON body pretty-printed).
func shellWords(line string) (words []string, tail string, err error) {
	var cur strings.Builder
	inWord := false
	flush := func() {
		if inWord {
			words = append(words, cur.String())
			cur.Reset()
			inWord = false
		}
	}
	for i := 0; i < len(line); i++ {
		c := line[i]
		switch {
		case c == ' ' || c == '\t':
			flush()
		case c == '#' && !inWord:
			i = len(line)
		case c == '\'':
			j := strings.IndexByte(line[i+1:], '\'')
			if j < 0 {
				return nil, "", fmt.Errorf("unterminated '")
			}
			cur.WriteString(line[i+1 : i+1+j])
			inWord = true
			i += j + 1
		case c == '"':
			inWord = true
			for i++; i < len(line) && line[i] != '"'; i++ {
				if line[i] == '\\' && i+1 < len(line) && strings.IndexByte(`"\$`+"`", line[i+1]) >= 0 {
					i++
				}
				cur.WriteByte(line[i])
			}
			if i == len(line) {
				return nil, "", fmt.Errorf("unterminated \"")
			}
		case c == '\\' && i+1 < len(line):
			i++
			cur.WriteByte(line[i])
			inWord = true
		default:
			cur.WriteByte(c)
			inWord = true
		}
	}
	flush()
	n := len(words)
	switch {
	case n >= 2 && words[n-2] == ">" && words[n-1] == "/dev/null":
		return words[:n-2], "null", nil
	case n >= 1 && words[n-1] == ">/dev/null":
		return words[:n-1], "null", nil
	case n >= 3 && words[n-3] == "|" && words[n-2] == "jq" && words[n-1] == ".":
		return words[:n-3], "jq", nil
	}
	if slices.ContainsFunc(words, func(w string) bool { return w == "|" || w == ">" || w == "&&" || w == ";" }) {
		return nil, "", fmt.Errorf("a doc command may end in > /dev/null or | jq ., nothing else")
	}
	return words, "", nil
}

// docStep is one command of a console block and what the block shows it
// printing.
type docStep struct {
	cmd  string
	want string
}

func consoleSteps(body string) []docStep {
	var steps []docStep
	lines := strings.Split(body, "\n")
	for i := 0; i < len(lines); i++ {
		l := lines[i]
		if !strings.HasPrefix(l, "$ ") {
			if len(steps) > 0 {
				steps[len(steps)-1].want += l + "\n"
			}
			continue
		}
		cmd := strings.TrimPrefix(l, "$ ")
		for strings.HasSuffix(cmd, `\`) && i+1 < len(lines) {
			i++
			cmd = strings.TrimSuffix(cmd, `\`) + " " + strings.TrimSpace(lines[i])
		}
		steps = append(steps, docStep{cmd: cmd})
	}
	return steps
}

var addrRE = regexp.MustCompile(`127\.0\.0\.1:\d+`)

// runDoctest runs a console block: it starts the node its directive asks
// for, then each command, and compares what it prints with the block.
func runDoctest(t *testing.T, b mdBlock) {
	addrs := map[string]string{} // the docs' address -> the test's
	mapAddr := func(a string) string {
		if addrs[a] == "" {
			addrs[a] = freePort(t)
		}
		return addrs[a]
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if rest, ok := strings.CutPrefix(b.directive, "doctest:"); ok {
		args, _, err := shellWords(rest)
		if err != nil || len(args) == 0 || args[0] != "serve" {
			t.Fatalf("%s: directive %q: want doctest: serve ARGS", b.where(), b.directive)
		}
		args = args[1:]
		if !slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, "--listen") }) {
			args = append(args, "--listen", "127.0.0.1:7070")
		}
		if !slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, "--admin-listen") }) {
			args = append(args, "--admin-listen", "off")
		}
		for i, a := range args {
			args[i] = addrRE.ReplaceAllStringFunc(a, mapAddr)
		}
		mapAddr("127.0.0.1:7070")
		var log bytes.Buffer
		done := make(chan int, 1)
		go func() { done <- run(ctx, append([]string{"serve"}, args...), io.Discard, &log) }()
		dial := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
		if err := waitServing(ctx, addrs["127.0.0.1:7070"], dial, 30*time.Second); err != nil {
			cancel()
			<-done
			t.Fatalf("%s: freqring serve %s: %v\n%s", b.where(), strings.Join(args, " "), err, log.String())
		}
		defer func() {
			cancel()
			if code := <-done; code != 0 {
				t.Errorf("serve exited %d\n%s", code, log.String())
			}
		}()
	}
	for _, st := range consoleSteps(b.body) {
		words, tail, err := shellWords(st.cmd)
		if err != nil || len(words) == 0 {
			t.Fatalf("%s: %q: %v", b.where(), st.cmd, err)
		}
		for i, w := range words {
			words[i] = addrRE.ReplaceAllStringFunc(w, func(a string) string {
				if addrs[a] != "" {
					return addrs[a]
				}
				return a
			})
		}
		var got string
		var same func(want, got string) error
		switch words[0] {
		case "freqring":
			args := words[1:]
			if takesAddr(args) {
				args = append(args, "--addr", addrs["127.0.0.1:7070"])
			}
			var out bytes.Buffer
			run(ctx, args, &out, &out)
			got, same = out.String(), sameText
		case "curl":
			got, same = runCurl(t, words[1:], tail), sameHTTP
		case "grpcurl":
			got, same = runGrpcurl(t, ctx, words[1:]), sameRLS
		default:
			t.Fatalf("%s: %q: the doc test runs freqring, curl and grpcurl, not %s", b.where(), st.cmd, words[0])
		}
		for doc, real := range addrs {
			got = strings.ReplaceAll(got, real, doc)
		}
		if tail == "null" {
			if strings.TrimSpace(st.want) != "" {
				t.Errorf("%s: %q shows output, but sends it to /dev/null", b.where(), st.cmd)
			}
			continue
		}
		if err := same(st.want, got); err != nil {
			t.Errorf("%s: $ %s\n%v\n--- the docs show:\n%s--- it printed:\n%s", b.where(), st.cmd, err, st.want, got)
		}
	}
}

// takesAddr reports whether a freqring command line dials a node and names
// none: it then gets the test node's address.
func takesAddr(args []string) bool {
	if len(args) == 0 || slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, "--addr") }) {
		return false
	}
	switch args[0] {
	case "check", "explain", "status", "stats", "override":
		return !slices.Contains(args, "--")
	}
	return false
}

var (
	timeRE     = regexp.MustCompile(`\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z`)
	dateRE     = regexp.MustCompile(`\d{4}-\d\d-\d\d`)
	unixMsRE   = regexp.MustCompile(`\b\d{13}\b`)
	retryRE    = regexp.MustCompile(`retry after \d+(\.\d+)?m?s\b`)
	lastDurRE  = regexp.MustCompile(`(?m) \d+(\.\d+)?m?s$`) // the retry-after column
	spaceRE    = regexp.MustCompile(`[ \t]+`)
	retryMsRE  = regexp.MustCompile(`\b\d+ ms\b`)
	httpDateRE = regexp.MustCompile(`(?m)^Date: .*$`)
	lengthRE   = regexp.MustCompile(`(?m)^Content-Length: \d+$`)
)

// normalize hides what changes from run to run: timestamps and dates, unix
// ms (override versions), retry-after durations, column
// spacing and trailing blank lines.
func normalize(s string) string {
	s = timeRE.ReplaceAllString(s, "<time>")
	s = dateRE.ReplaceAllString(s, "<date>")
	s = unixMsRE.ReplaceAllString(s, "<unix-ms>")
	s = retryRE.ReplaceAllString(s, "retry after <duration>")
	s = lastDurRE.ReplaceAllString(s, " <duration>")
	s = retryMsRE.ReplaceAllString(s, "<n> ms")
	s = httpDateRE.ReplaceAllString(s, "Date: <date>")
	s = lengthRE.ReplaceAllString(s, "Content-Length: <n>")
	var lines []string
	for l := range strings.SplitSeq(s, "\n") {
		lines = append(lines, strings.TrimSpace(spaceRE.ReplaceAllString(l, " ")))
	}
	return strings.TrimRight(strings.Join(lines, "\n"), "\n")
}

func sameText(want, got string) error {
	if normalize(want) != normalize(got) {
		return fmt.Errorf("output differs")
	}
	return nil
}

// runCurl does what curl does with the options the docs use: -s, -S, -i,
// -D -, -o /dev/null, -H, -d, -X, and prints it as curl does.
func runCurl(t *testing.T, args []string, tail string) string {
	var (
		method, url, data string
		include, noBody   bool
		headers           [][2]string
	)
	for i := 0; i < len(args); i++ {
		next := func() string {
			i++
			if i == len(args) {
				t.Fatalf("curl %q: %s wants a value", args, args[i-1])
			}
			return args[i]
		}
		switch a := args[i]; a {
		case "-s", "-S", "-sS", "--silent":
		case "-i", "--include":
			include = true
		case "-D":
			if next() != "-" {
				t.Fatalf("curl: -D %s: the doc test dumps headers to - only", args[i])
			}
			include = true
		case "-o":
			if next() != "/dev/null" {
				t.Fatalf("curl: -o %s: the doc test writes to /dev/null only", args[i])
			}
			noBody = true
		case "-H", "--header":
			k, v, _ := strings.Cut(next(), ":")
			headers = append(headers, [2]string{k, strings.TrimSpace(v)})
		case "-d", "--data":
			data = next()
		case "-X":
			method = next()
		default:
			if strings.HasPrefix(a, "-") {
				t.Fatalf("curl: option %s: not one the doc test knows", a)
			}
			url = a
		}
	}
	if method == "" {
		method = http.MethodGet
		if data != "" {
			method = http.MethodPost
		}
	}
	req, err := http.NewRequest(method, url, strings.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	if data != "" {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	for _, h := range headers {
		req.Header.Set(h[0], h[1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("curl %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var b strings.Builder
	if include {
		fmt.Fprintf(&b, "HTTP/1.1 %s\n", resp.Status)
		for _, k := range slices.Sorted(func(yield func(string) bool) {
			for k := range resp.Header {
				if !yield(k) {
					return
				}
			}
		}) {
			for _, v := range resp.Header[k] {
				fmt.Fprintf(&b, "%s: %s\n", k, v)
			}
		}
		b.WriteString("\n")
	}
	if !noBody {
		if tail == "jq" {
			var v any
			if err := json.Unmarshal(body, &v); err != nil {
				t.Fatalf("curl ... | jq .: %v: %s", err, body)
			}
			pretty, _ := json.MarshalIndent(v, "", "  ")
			body = append(pretty, '\n')
		}
		b.Write(body)
	}
	return b.String()
}

// sameHTTP compares an HTTP answer as curl prints it: the status line, the
// set of headers (Date and Content-Length hidden), and the body as JSON
// (normalizeJSON), each where the docs show it.
func sameHTTP(want, got string) error {
	split := func(s string) (head []string, body string) {
		s = strings.TrimLeft(s, "\n")
		if !strings.HasPrefix(s, "HTTP/") {
			return nil, s
		}
		h, b, _ := strings.Cut(s, "\n\n")
		for l := range strings.SplitSeq(normalize(h), "\n") {
			head = append(head, l)
		}
		return head, b
	}
	wh, wb := split(want)
	gh, gb := split(got)
	if len(wh) > 0 {
		slices.Sort(wh[1:])
		slices.Sort(gh[1:])
	}
	if !slices.Equal(wh, gh) {
		return fmt.Errorf("status line or headers differ")
	}
	if strings.TrimSpace(wb) == "" && strings.TrimSpace(gb) == "" {
		return nil
	}
	return sameJSON(wb, gb)
}

func sameJSON(want, got string) error {
	var w, g any
	if err := json.Unmarshal([]byte(want), &w); err != nil {
		return fmt.Errorf("the docs' body is not JSON: %v", err)
	}
	if err := json.Unmarshal([]byte(got), &g); err != nil {
		return fmt.Errorf("the body is not JSON: %v", err)
	}
	wn, _ := json.Marshal(normalizeJSON("", w))
	gn, _ := json.Marshal(normalizeJSON("", g))
	if !bytes.Equal(wn, gn) {
		return fmt.Errorf("bodies differ:\n docs: %s\n got:  %s", wn, gn)
	}
	return nil
}

// normalizeJSON hides, in a decoded JSON value, what changes from run to
// run: timestamps, retry-after in ms, durations until reset rounded up to
// whole seconds.
func normalizeJSON(key string, v any) any {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			x[k] = normalizeJSON(k, e)
		}
	case []any:
		for i, e := range x {
			x[i] = normalizeJSON(key, e)
		}
	case float64:
		if key == "retry_after_ms" && x > 0 {
			return "<ms>"
		}
	case string:
		if key == "durationUntilReset" || key == "duration_until_reset" {
			if d, err := time.ParseDuration(x); err == nil {
				return fmt.Sprintf("%ds", int64(math.Ceil(d.Seconds())))
			}
		}
		return normalize(x)
	}
	return v
}

// runGrpcurl calls Envoy's rate limit service as
// "grpcurl -plaintext -d JSON ADDR envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
// does, and prints the answer as JSON.
func runGrpcurl(t *testing.T, ctx context.Context, args []string) string {
	var data, addr, method string
	for i := 0; i < len(args); i++ {
		switch a := args[i]; {
		case a == "-plaintext":
		case a == "-d" && i+1 < len(args):
			i++
			data = args[i]
		case strings.HasPrefix(a, "-"):
			t.Fatalf("grpcurl: option %s: not one the doc test knows", a)
		case addr == "":
			addr = a
		default:
			method = a
		}
	}
	if method != "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit" {
		t.Fatalf("grpcurl: method %q: the doc test calls ShouldRateLimit only", method)
	}
	var req rlsv3.RateLimitRequest
	if err := protojson.Unmarshal([]byte(data), &req); err != nil {
		t.Fatalf("grpcurl -d %s: %v", data, err)
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	resp, err := rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, &req)
	if err != nil {
		return fmt.Sprintf("ERROR:\n  %v\n", err)
	}
	b, _ := protojson.MarshalOptions{Multiline: true, Indent: "  "}.Marshal(resp)
	return string(b) + "\n"
}

// sameRLS compares two ShouldRateLimit answers as JSON, durations until
// reset rounded up to whole seconds.
func sameRLS(want, got string) error {
	var w, g rlsv3.RateLimitResponse
	if err := protojson.Unmarshal([]byte(want), &w); err != nil {
		return fmt.Errorf("the docs' answer is not a RateLimitResponse: %v", err)
	}
	if err := protojson.Unmarshal([]byte(got), &g); err != nil {
		return fmt.Errorf("the answer is not a RateLimitResponse: %v", err)
	}
	for _, r := range []*rlsv3.RateLimitResponse{&w, &g} {
		for _, s := range r.Statuses {
			if d := s.DurationUntilReset; d != nil {
				d.Seconds, d.Nanos = int64(math.Ceil(d.AsDuration().Seconds())), 0
			}
		}
	}
	if !proto.Equal(&w, &g) {
		return fmt.Errorf("answers differ:\n docs: %v\n got:  %v", &w, &g)
	}
	return nil
}

var (
	mdLinkRE     = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	headingRE    = regexp.MustCompile(`(?m)^#{1,6} (.+)$`)
	htmlAnchorRE = regexp.MustCompile(`<a id="([^"]+)"></a>`)
	forbidden    = regexp.MustCompile(`\.\./shared|[Ii]ssues? [0-9]+|[Ss]eeds? 00[0-9]`)
	slugDropRE   = regexp.MustCompile(`[^\p{L}\p{N} _-]`)
)

// slug is GitHub's anchor for a heading.
func slug(h string) string {
	h = strings.ToLower(strings.TrimSpace(h))
	h = strings.ReplaceAll(h, "`", "")
	h = slugDropRE.ReplaceAllString(h, "")
	return strings.ReplaceAll(h, " ", "-")
}

// TestDocLinks checks every relative link of the Markdown files (the file,
// and the heading of an #anchor), and that no Markdown file names paths
// outside the repository, issue numbers or seeds.
func TestDocLinks(t *testing.T) {
	root := repoRoot(t)
	t.Chdir(root)
	anchors := map[string]map[string]bool{}
	files := markdownFiles(t, root)
	texts := map[string]string{}
	for _, f := range files {
		b, _ := os.ReadFile(f)
		texts[f] = string(b)
		anchors[f] = map[string]bool{}
		inFence := false
		for l := range strings.SplitSeq(string(b), "\n") {
			if strings.HasPrefix(l, "```") {
				inFence = !inFence
			}
			if m := headingRE.FindStringSubmatch(l); m != nil && !inFence {
				anchors[f][slug(m[1])] = true
			}
			for _, m := range htmlAnchorRE.FindAllStringSubmatch(l, -1) {
				anchors[f][m[1]] = true
			}
		}
	}
	for _, f := range files {
		for i, l := range strings.Split(texts[f], "\n") {
			if m := forbidden.FindString(l); m != "" {
				t.Errorf("%s:%d: %q: the docs name neither paths outside the repository nor issues or seeds", f, i+1, m)
			}
			for _, m := range mdLinkRE.FindAllStringSubmatch(l, -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				path, anchor, _ := strings.Cut(target, "#")
				file := f
				if path != "" {
					file = filepath.Clean(filepath.Join(filepath.Dir(f), path))
					if strings.HasPrefix(file, "..") {
						t.Errorf("%s:%d: link %s leaves the repository", f, i+1, target)
						continue
					}
					if _, err := os.Stat(file); err != nil {
						t.Errorf("%s:%d: link %s: %v", f, i+1, target, err)
						continue
					}
				}
				if anchor != "" && strings.HasSuffix(file, ".md") && !anchors[file][anchor] {
					t.Errorf("%s:%d: link %s: %s has no heading #%s", f, i+1, target, file, anchor)
				}
			}
		}
	}
}

var metricNameRE = regexp.MustCompile(`\bfreqring_[a-z_]+[a-z]`)

// TestDocMetrics checks that the metrics the Markdown names are the ones
// the code exports (metrics and client/clientmetrics), and that
// docs/operations.md names every one of them.
func TestDocMetrics(t *testing.T) {
	root := repoRoot(t)
	t.Chdir(root)
	exported := map[string]bool{}
	for _, dir := range []string{"metrics", "client/clientmetrics"} {
		files, _ := filepath.Glob(filepath.Join(dir, "*.go"))
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			b, _ := os.ReadFile(f)
			for _, m := range regexp.MustCompile(`"(freqring_[a-z_]+)"`).FindAllSubmatch(b, -1) {
				exported[string(m[1])] = true
			}
		}
	}
	if len(exported) < 40 {
		t.Fatalf("found only %d metric names in the code: has the way they are declared changed?", len(exported))
	}
	for _, f := range markdownFiles(t, root) {
		b, _ := os.ReadFile(f)
		for i, l := range strings.Split(string(b), "\n") {
			for _, name := range metricNameRE.FindAllString(l, -1) {
				if !exported[name] {
					t.Errorf("%s:%d: %s is no metric the code exports", f, i+1, name)
				}
			}
		}
	}
	ops, _ := os.ReadFile(filepath.Join("docs", "operations.md"))
	for name := range exported {
		if !strings.Contains(string(ops), "`"+name) {
			t.Errorf("docs/operations.md does not list %s", name)
		}
	}
}
