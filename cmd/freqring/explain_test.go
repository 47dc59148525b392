package main

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"reflect"
	"strings"
	"testing"
	"time"

	pb "github.com/freqring/freqring/api/freqringv1"
	"github.com/freqring/freqring/api/wire"
	"github.com/freqring/freqring/client"
	"github.com/freqring/freqring/gateway"
	"github.com/freqring/freqring/node"
	"github.com/freqring/freqring/node/nodetest"
)

// TestExplainSameInEveryFrontEnd sends a content three times to one
// recipient of a 3-node cluster (the third is denied by content-59s), then
// explains it through the Go client (gRPC, to the owner), the HTTP
// gateway of a member that may not own it, and `freqring explain --json`:
// the three answers agree, and each lists the two admitted sends at the
// times their checks were decided.
func TestExplainSameInEveryFrontEnd(t *testing.T) {
	ctx := context.Background()
	c, err := nodetest.Start(ctx, nodetest.Config{Size: 3})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.WaitSettled(ctx); err != nil {
		t.Fatal(err)
	}
	cli, err := client.New(ctx, client.Config{Seeds: c.Addrs()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	const rcp, content = "+8613800000042", "your code is 4321"
	var sent []int64
	for i := range 3 {
		d, err := cli.Check(ctx, client.Item{Recipient: rcp, Content: []byte(content)})
		if err != nil || d.Admitted != (i < 2) {
			t.Fatalf("check %d: %+v %v", i, d, err)
		}
		if d.Admitted {
			sent = append(sent, d.DecidedAt.UnixMilli())
		}
	}

	resp, err := cli.Explain(ctx, &pb.ExplainRequest{Recipient: rcp, Content: []byte(content)})
	if err != nil {
		t.Fatal(err)
	}
	viaClient := wire.ExplanationOf(resp)

	gw, err := gateway.New(gateway.Config{Checker: c.Members()[1].Node, Explainer: c.Members()[1].Node, Caller: node.WithCaller})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(gw)
	defer srv.Close()
	hr, err := http.Get(srv.URL + "/v1/explain?" + url.Values{"recipient": {rcp}, "content": {content}}.Encode())
	if err != nil {
		t.Fatal(err)
	}
	defer hr.Body.Close()
	var viaHTTP wire.Explanation
	if err := json.NewDecoder(hr.Body).Decode(&viaHTTP); err != nil || hr.StatusCode != http.StatusOK {
		t.Fatalf("GET /v1/explain: %d %v", hr.StatusCode, err)
	}

	code, out, errOut := runCmd(ctx, "explain", "--addr", strings.Join(c.Addrs(), ","), "--json", "--content", content, rcp)
	if code != 0 {
		t.Fatalf("explain: exit %d: %s", code, errOut)
	}
	var viaCLI wire.Explanation
	if err := json.Unmarshal([]byte(out), &viaCLI); err != nil {
		t.Fatalf("%s: %v", out, err)
	}

	for _, e := range []*wire.Explanation{viaClient, &viaHTTP, &viaCLI} {
		e.Now, e.NowMs = time.Time{}, 0 // the owner's clock moves between calls, and the retries with it
		for i := range e.Rules {
			if e.Rules[i].RetryAfterMs > 0 {
				e.Rules[i].RetryAfterMs = 1
			}
		}
	}
	if !reflect.DeepEqual(viaHTTP, *viaClient) || !reflect.DeepEqual(viaCLI, *viaClient) {
		t.Fatalf("explanations differ:\nclient %+v\nHTTP   %+v\nCLI    %+v", *viaClient, viaHTTP, viaCLI)
	}
	if viaCLI.Admitted || viaCLI.DeniedBy != "content-59s" || viaCLI.NextAdmittedMs != sent[0]+59_000 {
		t.Fatalf("%+v: want denied by content-59s until %d", viaCLI, sent[0]+59_000)
	}
	for _, r := range viaCLI.Rules {
		var at []int64
		for _, s := range r.Sends {
			at = append(at, s.AtMs)
		}
		if !reflect.DeepEqual(at, sent) {
			t.Fatalf("rule %s counts sends at %v, want %v", r.Name, at, sent)
		}
	}

	code, out, _ = runCmd(ctx, "explain", "--addr", c.Addrs()[2], "--content", content, rcp)
	if code != 0 || !strings.Contains(out, "next message: DENIED by content-59s until ") || !strings.Contains(out, "content-59s counts 2 sends:") {
		t.Fatalf("explain: exit %d:\n%s", code, out)
	}
}

// TestExplainHTTPBadQuery: a bad query is a 400 naming the parameter.
func TestExplainHTTPBadQuery(t *testing.T) {
	ctx := context.Background()
	c, err := nodetest.Start(ctx, nodetest.Config{Size: 1, InMemory: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	n := c.Members()[0].Node
	gw, err := gateway.New(gateway.Config{Checker: n, Explainer: n})
	if err != nil {
		t.Fatal(err)
	}
	for q, want := range map[string]string{
		"":                           "query parameter recipient: missing",
		"recipient=%2B1&colour=red":  `query parameter "colour" is not one of`,
		"recipient=%2B1&cost=x":      `query parameter cost "x"`,
		"recipient=%2B1&domain=nope": `domain: unknown domain "nope"`,
	} {
		rec := httptest.NewRecorder()
		gw.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/v1/explain?"+q, nil))
		var p gateway.Problem
		if err := json.Unmarshal(rec.Body.Bytes(), &p); err != nil || rec.Code != http.StatusBadRequest || !strings.Contains(p.Detail, want) {
			t.Errorf("%q: %d %s, want 400 naming %s", q, rec.Code, rec.Body, want)
		}
	}
}
