package main

import (
	"context"
	"fmt"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	pb "github.com/freqring/freqring/api/freqringv1"
	"github.com/freqring/freqring/metrics"
	"github.com/freqring/freqring/node"
	"github.com/freqring/freqring/node/nodetest"
	"github.com/freqring/freqring/rules"
)

// browser starts a headless Chromium for the test, or skips the test when
// none is installed (fails instead under CI_REQUIRE_CHROMIUM, which .ci/run
// sets after installing Debian's chromium).
func browser(t *testing.T) context.Context {
	t.Helper()
	path, err := exec.LookPath("chromium")
	if err != nil {
		if os.Getenv("CI_REQUIRE_CHROMIUM") != "" {
			t.Fatal("chromium is not installed and CI_REQUIRE_CHROMIUM is set")
		}
		t.Skip("chromium is not installed (apt-get install chromium)")
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(path), chromedp.NoSandbox,
		chromedp.WindowSize(1280, 900), chromedp.Flag("disable-dev-shm-usage", true))
	actx, cancel := chromedp.NewExecAllocator(context.Background(), opts...)
	t.Cleanup(cancel)
	ctx, cancelCtx := chromedp.NewContext(actx)
	t.Cleanup(cancelCtx)
	ctx, cancelTimeout := context.WithTimeout(ctx, 2*time.Minute)
	t.Cleanup(cancelTimeout)
	if err := chromedp.Do(ctx); err != nil { // starts the browser
		t.Fatalf("starting chromium: %v", err)
	}
	return ctx
}

// screenshot saves the page as NAME.png in the test's artifact directory
// (go test -artifacts keeps it).
func screenshot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot %s: %v", name, err)
	}
	if err := os.WriteFile(filepath.Join(t.ArtifactDir(), name+".png"), png, 0o644); err != nil {
		t.Fatal(err)
	}
}

// text returns the text of the element with id.
func text(t *testing.T, ctx context.Context, id string) string {
	t.Helper()
	s, err := chromedp.Run(ctx, chromedp.Text(chromedp.ID(id)))
	if err != nil {
		t.Fatalf("#%s: %v", id, err)
	}
	return s
}

// TestConsoleInBrowser drives the console of a 3-node cluster in Chromium:
// a recipient sent one content three times is found, its next message
// denied by content-59s until the exact time the first send leaves that
// window; an override set through the form is refused without the admin
// token and applied on every member with it, after which the next check is
// admitted; and every page renders (a screenshot of each is saved).
func TestConsoleInBrowser(t *testing.T) {
	ctx := browser(t)
	tokens := writeTokenFile(t)
	operator, err := loadTokenFile(tokens)
	if err != nil {
		t.Fatal(err)
	}
	token := string(operator.Keys()[0])
	lc, err := nodetest.Start(context.Background(), nodetest.Config{Size: 3, Rules: rules.Default(), Node: func(cfg *node.Config) { cfg.AdminTokens = operator }})
	if err != nil {
		t.Fatal(err)
	}
	defer lc.Close()
	if err := lc.WaitSettled(context.Background()); err != nil {
		t.Fatal(err)
	}
	m := lc.Members()[0]
	con, closeConsole, err := newConsole(m.Node, m.Name, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer closeConsole()
	srv := httptest.NewServer(adminHandler(metrics.NewRegistry(m.Node, nil), m.Node.Serving, false, con))
	defer srv.Close()

	const rcp, content = "+8613800000077", "your code is 7777"
	check := func() *pb.CheckResponse {
		t.Helper()
		resp, err := lc.Members()[1].Node.Check(context.Background(), &pb.CheckRequest{Recipients: []string{rcp}, Contents: [][]byte{[]byte(content)}})
		if err != nil || len(resp.Errors) > 0 {
			t.Fatalf("check: %v %v", resp, err)
		}
		return resp
	}
	first := check().DecidedAtMs[0]
	check()
	if check().Admitted[0] {
		t.Fatal("the third send of one content within 59 s was admitted")
	}

	// Find the recipient.
	if err := chromedp.Do(ctx,
		chromedp.Navigate(srv.URL+"/"),
		chromedp.SendKeys(chromedp.ID("recipient"), rcp),
		chromedp.SendKeys(chromedp.ID("content"), content),
		chromedp.Click(chromedp.ID("explain")),
		chromedp.WaitVisible(chromedp.ID("verdict")),
	); err != nil {
		t.Fatal(err)
	}
	deniedBy, next := text(t, ctx, "denied-by"), text(t, ctx, "next-admitted")
	if want := time.UnixMilli(first + 59_000).UTC().Format("2006-01-02 15:04:05.000Z"); deniedBy != "content-59s" || next != want {
		t.Fatalf("denied by %q, next admitted at %q; want content-59s at %s", deniedBy, next, want)
	}
	screenshot(t, ctx, "recipient")

	// An override through the form: refused without the token.
	if err := chromedp.Do(ctx,
		chromedp.SendKeys(chromedp.ID("limits"), "content-59s=5"),
		chromedp.Click(chromedp.ID("set-override")),
		chromedp.WaitVisible(chromedp.ID("error")),
	); err != nil {
		t.Fatal(err)
	}
	refusal := text(t, ctx, "error")
	if !strings.Contains(refusal, "needs an admin token") {
		t.Fatalf("without a token: %q", refusal)
	}
	if check().Admitted[0] {
		t.Fatal("the refused override changed a decision")
	}
	// With the token: set on every member.
	if err := chromedp.Do(ctx,
		chromedp.Navigate(fmt.Sprintf("%s/?recipient=%s&content=%s", srv.URL, "%2B"+rcp[1:], strings.ReplaceAll(content, " ", "+"))),
		chromedp.WaitVisible(chromedp.ID("override-form")),
		chromedp.SendKeys(chromedp.ID("limits"), "content-59s=5"),
		chromedp.SendKeys(chromedp.ID("token"), token),
		chromedp.Click(chromedp.ID("set-override")),
		chromedp.WaitVisible(chromedp.ID("results")),
	); err != nil {
		t.Fatal(err)
	}
	results := text(t, ctx, "results")
	for _, mm := range lc.Members() {
		if !strings.Contains(results, mm.Name+"\tok") && !strings.Contains(results, mm.Name+" ok") {
			t.Fatalf("results %q: want %s ok", results, mm.Name)
		}
	}
	if !check().Admitted[0] {
		t.Fatal("after the override (content-59s=5) the next check was denied")
	}

	// Every page renders; the Live page draws the default domain.
	for _, p := range []struct{ path, wait string }{
		{"/live", "#live-default"}, {"/cluster", "#members"}, {"/rules", "#overrides"}, {"/usage", "#usage"},
	} {
		if err := chromedp.Do(ctx, chromedp.Navigate(srv.URL+p.path), chromedp.WaitVisible(chromedp.CSS(p.wait))); err != nil {
			t.Fatalf("%s: %v", p.path, err)
		}
		screenshot(t, ctx, strings.TrimPrefix(p.path, "/"))
	}
	if err := chromedp.Do(ctx, chromedp.Navigate(srv.URL+"/rules")); err != nil {
		t.Fatal(err)
	}
	setBy := text(t, ctx, "overrides")
	if !strings.Contains(setBy, "console ") {
		t.Fatalf("the rules page does not say the console set the override: %q", setBy)
	}
}
