package console

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	pb "github.com/freqring/freqring/api/freqringv1"
)

// csrfCookie holds the token a form must echo (the double-submit pattern):
// a page on another site can post a form here, but can neither read the
// cookie nor set the field to match it.
const csrfCookie = "freqring_csrf"

// csrfToken returns the request's CSRF token, setting a new one in a
// cookie when it has none.
func csrfToken(w http.ResponseWriter, r *http.Request) string {
	if c, err := r.Cookie(csrfCookie); err == nil && len(c.Value) == 32 {
		return c.Value
	}
	var b [16]byte
	rand.Read(b[:])
	tok := hex.EncodeToString(b[:])
	http.SetCookie(w, &http.Cookie{Name: csrfCookie, Value: tok, Path: "/", HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil})
	return tok
}

// authorize checks a form that changes state: it comes from this site
// (its Origin, when sent, is this host; its CSRF field matches its
// cookie), and carries one of the node's admin tokens. It returns the
// token, or the status and reason to refuse with.
func (h *Handler) authorize(r *http.Request) (token string, code int, why string) {
	if o := r.Header.Get("Origin"); o != "" {
		if u, err := url.Parse(o); err != nil || u.Host != r.Host {
			return "", http.StatusForbidden, fmt.Sprintf("the form was posted from %s, not from this console (%s)", o, r.Host)
		}
	}
	c, err := r.Cookie(csrfCookie)
	if err != nil || subtle.ConstantTimeCompare([]byte(c.Value), []byte(r.PostFormValue("csrf"))) != 1 {
		return "", http.StatusForbidden, "the form's CSRF token does not match its cookie: reload the page and submit it again"
	}
	token = strings.TrimSpace(r.PostFormValue("token"))
	switch {
	case token == "":
		return "", http.StatusUnauthorized, "changing an override needs an admin token: one line of the node's --admin-token-file"
	case !h.cfg.Backend.AdminToken(token):
		return "", http.StatusUnauthorized, "the admin token is not one of this node's (--admin-token-file); nothing changed"
	}
	return token, 0, ""
}

// doneView is the page a change answers with.
type doneView struct {
	What      string
	Results   []MemberResult
	Failed    int
	Recipient string // the recipient page to go back to, if any
}

// setOverride sets an override from the Recipient page's form: for the
// recipient, exempt or with limits per rule (rule=limit, comma-separated),
// on every member.
func (h *Handler) setOverride(w http.ResponseWriter, r *http.Request) {
	token, code, why := h.authorize(r)
	if code != 0 {
		h.refuse(w, r, code, why)
		return
	}
	o := &pb.Override{Name: strings.TrimSpace(r.PostFormValue("name")), Domain: r.PostFormValue("domain"),
		Recipients: []string{r.PostFormValue("recipient")}, Exempt: r.PostFormValue("exempt") == "on"}
	if o.Domain == "" {
		o.Domain = "default"
	}
	if o.Name == "" {
		o.Name = "console-" + r.PostFormValue("recipient")
	}
	if limits := strings.TrimSpace(r.PostFormValue("limits")); limits != "" {
		o.Limits = map[string]uint32{}
		for _, kv := range strings.Split(limits, ",") {
			k, v, ok := strings.Cut(strings.TrimSpace(kv), "=")
			n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 32)
			if !ok || err != nil {
				h.refuse(w, r, http.StatusBadRequest, fmt.Sprintf("limits %q: want rule=limit, comma-separated (e.g. content-59s=5)", kv))
				return
			}
			o.Limits[strings.TrimSpace(k)] = uint32(n)
		}
	}
	ctx, cancel := h.ctx(r)
	defer cancel()
	res := h.cfg.Backend.SetOverride(ctx, who(r), token, o)
	h.cfg.Log.Info("console: override set", "override", o.Name, "domain", o.Domain, "recipient", o.Recipients[0], "by", who(r))
	h.done(w, r, fmt.Sprintf("Set override %q for %s", o.Name, o.Recipients[0]), res, o.Recipients[0])
}

// deleteOverride lifts an admin override by name, on every member.
func (h *Handler) deleteOverride(w http.ResponseWriter, r *http.Request) {
	token, code, why := h.authorize(r)
	if code != 0 {
		h.refuse(w, r, code, why)
		return
	}
	name := strings.TrimSpace(r.PostFormValue("name"))
	if name == "" {
		h.refuse(w, r, http.StatusBadRequest, "name: missing")
		return
	}
	ctx, cancel := h.ctx(r)
	defer cancel()
	res := h.cfg.Backend.DeleteOverride(ctx, who(r), token, name)
	h.cfg.Log.Info("console: override lifted", "override", name, "by", who(r))
	h.done(w, r, fmt.Sprintf("Lifted override %q", name), res, r.PostFormValue("recipient"))
}

// refuse answers a change it does not make.
func (h *Handler) refuse(w http.ResponseWriter, r *http.Request, code int, why string) {
	h.cfg.Log.Warn("console: change refused", "path", r.URL.Path, "by", who(r), "why", why)
	h.render(w, r, code, "done", "Refused", doneView{What: "Nothing changed", Recipient: r.PostFormValue("recipient")}, fmt.Errorf("refused: %s", why))
}

// done answers a change with each member's outcome.
func (h *Handler) done(w http.ResponseWriter, r *http.Request, what string, res []MemberResult, recipient string) {
	v := doneView{What: what, Results: res, Recipient: recipient}
	for _, m := range res {
		if m.Err != "" {
			v.Failed++
		}
	}
	code := http.StatusOK
	if v.Failed > 0 {
		code = http.StatusBadGateway
	}
	h.render(w, r, code, "done", what, v, nil)
}
