package console

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/freqring/freqring/api/freqringv1"
	"github.com/freqring/freqring/api/wire"
)

// Backend is what the console asks of its node and of the cluster. Its
// methods are safe for concurrent use; errors are gRPC statuses or plain.
type Backend interface {
	// Explain explains a recipient (Limiter.Explain) on behalf of who,
	// whom the node logs with the lookup.
	Explain(ctx context.Context, who string, req *pb.ExplainRequest) (*pb.ExplainResponse, error)
	// Ring is the node's view of the ring, with every member gossip knows.
	Ring(ctx context.Context) (*pb.RingResponse, error)
	// Status asks member m for its status.
	Status(ctx context.Context, m *pb.Member) (*pb.StatusResponse, error)
	// Rules lists the node's domains and rules.
	Rules(ctx context.Context) (*pb.RulesResponse, error)
	// Overrides lists the node's overrides.
	Overrides(ctx context.Context) (*pb.OverrideListResponse, error)
	// Usage sums the members' usage statistics of the last days days
	// (UTC), as freqring stats does.
	Usage(ctx context.Context, days int) (Usage, error)
	// SetOverride sets o on every member of the ring, calling each with
	// the admin token on behalf of who; DeleteOverride lifts an override
	// by name likewise. Each returns one result per member.
	SetOverride(ctx context.Context, who, token string, o *pb.Override) []MemberResult
	DeleteOverride(ctx context.Context, who, token, name string) []MemberResult
	// AdminToken reports whether tok is one of the node's admin tokens
	// (false when it has none).
	AdminToken(tok string) bool
}

// Usage is the cluster's usage statistics (Backend.Usage).
type Usage struct {
	Days    []UsageDay // by date, then domain
	Missing []string   // members that did not answer, with why: their share is missing
}

// UsageDay is one domain's statistics on one day, summed over the members.
type UsageDay struct {
	Date       string // YYYY-MM-DD, UTC
	Domain     string
	Admitted   int64
	Denied     int64
	DeniedBy   map[string]int64 // per rule that denied
	Recipients int64            // distinct recipients, estimated
}

// MemberResult is one member's outcome of a change: Err is "" on success.
type MemberResult struct {
	Member string
	Err    string
}

// Config configures a console. A zero field takes the default named in its
// comment.
type Config struct {
	Backend Backend // required
	// Node is the name of the node serving the console.
	Node string
	// Log receives the console's own log lines (changes made through it);
	// nil means discard.
	Log *slog.Logger
	// Now is the clock of the Live page's samples; nil means time.Now.
	Now func() time.Time
	// Timeout bounds the calls one page makes; 0 means 5 seconds.
	Timeout time.Duration
}

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// Handler serves the console. It is safe for concurrent use; Close stops
// the Live page's sampler.
type Handler struct {
	cfg   Config
	pages map[string]*template.Template
	mux   *http.ServeMux
	live  *sampler
}

// New returns the console of cfg.
func New(cfg Config) (*Handler, error) {
	if cfg.Backend == nil {
		return nil, errors.New("console: Config.Backend is nil")
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = 5 * time.Second
	}
	h := &Handler{cfg: cfg, pages: map[string]*template.Template{}, mux: http.NewServeMux()}
	funcs := template.FuncMap{"ms": fmtMs, "dur": fmtDur, "join": strings.Join,
		"mul44":  func(n int) int { return 40 + n*44 },              // the Usage chart's width for n bars
		"sub180": func(a, b float64) float64 { return 180 - a - b }, // a bar's top, stacked on the baseline
	}
	for _, page := range []string{"recipient", "live", "cluster", "rules", "usage", "done"} {
		t, err := template.New("layout.html").Funcs(funcs).ParseFS(templateFS, "templates/layout.html", "templates/"+page+".html")
		if err != nil {
			return nil, fmt.Errorf("console: %w", err)
		}
		h.pages[page] = t
	}
	static, err := fs.Sub(staticFS, "static")
	if err != nil {
		return nil, err
	}
	h.live = newSampler(cfg.Backend, cfg.Now, cfg.Timeout)
	h.mux.Handle("GET /static/", http.StripPrefix("/static/", http.FileServerFS(static)))
	h.mux.HandleFunc("GET /{$}", h.recipient)
	h.mux.HandleFunc("GET /live", h.livePage)
	h.mux.HandleFunc("GET /live.json", h.liveJSON)
	h.mux.HandleFunc("GET /cluster", h.cluster)
	h.mux.HandleFunc("GET /rules", h.rules)
	h.mux.HandleFunc("GET /usage", h.usage)
	h.mux.HandleFunc("POST /override", h.setOverride)
	h.mux.HandleFunc("POST /override/delete", h.deleteOverride)
	return h, nil
}

// Close stops the Live page's sampler.
func (h *Handler) Close() { h.live.close() }

func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	// The console loads nothing from elsewhere and is framed by no one.
	w.Header().Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; form-action 'self'")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Referrer-Policy", "same-origin") // a form posts its own origin (no-referrer makes it "null")
	h.mux.ServeHTTP(w, r)
}

// page is what every page's template gets: its own data in Data.
type page struct {
	Title, Nav string
	Node       string
	CSRF       string
	Error      string
	Data       any
}

// render answers with status code and page name with data, and a CSRF
// cookie for its forms.
func (h *Handler) render(w http.ResponseWriter, r *http.Request, code int, name, title string, data any, pageErr error) {
	p := page{Title: title, Nav: name, Node: h.cfg.Node, CSRF: csrfToken(w, r), Data: data}
	if pageErr != nil {
		p.Error = pageErr.Error()
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	if err := h.pages[name].Execute(w, p); err != nil {
		h.cfg.Log.Error("console: rendering a page failed", "page", name, "err", err)
	}
}

func (h *Handler) ctx(r *http.Request) (context.Context, context.CancelFunc) {
	return context.WithTimeout(r.Context(), h.cfg.Timeout)
}

// who names the user of a request in logs: the console, and the client's
// address.
func who(r *http.Request) string { return "console " + r.RemoteAddr }

// recipientView is the Recipient page's data.
type recipientView struct {
	Query    explainQuery
	Ex       *wire.Explanation
	Rules    []timeline
	Domains  []string
	Override *pb.Override // the admin override in force for the recipient, if any
	Wait     string       // until the next message is admitted
}

// explainQuery is the Recipient page's search form.
type explainQuery struct {
	Recipient, Domain, Content string
}

func (h *Handler) recipient(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := h.ctx(r)
	defer cancel()
	q := r.URL.Query()
	v := recipientView{Query: explainQuery{Recipient: strings.TrimSpace(q.Get("recipient")), Domain: q.Get("domain"), Content: q.Get("content")}}
	if rr, err := h.cfg.Backend.Rules(ctx); err == nil {
		for _, d := range rr.Domains {
			v.Domains = append(v.Domains, d.Name)
		}
	}
	if v.Query.Recipient == "" {
		h.render(w, r, http.StatusOK, "recipient", "Recipient", v, nil)
		return
	}
	req := &pb.ExplainRequest{Recipient: v.Query.Recipient, Domain: v.Query.Domain}
	if v.Query.Content != "" {
		req.Content = []byte(v.Query.Content)
	}
	resp, err := h.cfg.Backend.Explain(ctx, who(r), req)
	if err != nil {
		code := http.StatusServiceUnavailable // moving, unreachable: try again
		if status.Code(err) == codes.InvalidArgument {
			code = http.StatusBadRequest
		}
		h.render(w, r, code, "recipient", "Recipient", v, fmt.Errorf("explain %s: %v", v.Query.Recipient, statusMessage(err)))
		return
	}
	v.Ex = wire.ExplanationOf(resp)
	v.Rules = timelines(v.Ex)
	v.Wait = fmtDur(resp.NextAdmittedMs - resp.NowMs)
	if resp.Override != "" {
		if ol, err := h.cfg.Backend.Overrides(ctx); err == nil {
			for _, o := range ol.Overrides {
				if o.Name == resp.Override {
					v.Override = o
				}
			}
		}
	}
	h.render(w, r, http.StatusOK, "recipient", "Recipient "+v.Query.Recipient, v, nil)
}

// clusterRow is one member on the Cluster page.
type clusterRow struct {
	M      *pb.Member
	InRing bool
	Owned  int
	St     *pb.StatusResponse
	Err    string
}

func (h *Handler) cluster(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := h.ctx(r)
	defer cancel()
	rr, err := h.cfg.Backend.Ring(ctx)
	if err != nil {
		h.render(w, r, http.StatusServiceUnavailable, "cluster", "Cluster", nil, fmt.Errorf("ring: %v", statusMessage(err)))
		return
	}
	inRing := map[string]bool{}
	for _, m := range rr.Members {
		inRing[m.Name] = true
	}
	rows := make([]clusterRow, len(rr.Known))
	done := make(chan struct{}, len(rr.Known))
	for i, m := range rr.Known {
		rows[i] = clusterRow{M: m, InRing: inRing[m.Name]}
		go func() { // members answer in parallel: the page waits for the slowest, not the sum
			defer func() { done <- struct{}{} }()
			st, err := h.cfg.Backend.Status(ctx, m)
			if err != nil {
				rows[i].Err = statusMessage(err)
				return
			}
			rows[i].St = st
		}()
	}
	for range rr.Known {
		<-done
	}
	h.render(w, r, http.StatusOK, "cluster", "Cluster", struct {
		Ring *pb.RingResponse
		Rows []clusterRow
	}{rr, rows}, nil)
}

// rulesView is the Rules page's data.
type rulesView struct {
	Status    *pb.StatusResponse
	Domains   []*pb.Domain
	Overrides []*pb.Override
	Deleted   []*pb.Override
}

func (h *Handler) rules(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := h.ctx(r)
	defer cancel()
	var v rulesView
	var errs []string
	if rr, err := h.cfg.Backend.Ring(ctx); err == nil {
		self := &pb.Member{Name: rr.Node}
		for _, m := range rr.Known {
			if m.Name == rr.Node {
				self = m
			}
		}
		if v.Status, err = h.cfg.Backend.Status(ctx, self); err != nil {
			errs = append(errs, "status: "+statusMessage(err))
		}
	}
	if rr, err := h.cfg.Backend.Rules(ctx); err != nil {
		errs = append(errs, "rules: "+statusMessage(err))
	} else {
		v.Domains = rr.Domains
	}
	if ol, err := h.cfg.Backend.Overrides(ctx); err != nil {
		errs = append(errs, "overrides: "+statusMessage(err))
	} else {
		v.Overrides, v.Deleted = ol.Overrides, ol.Deleted
	}
	var pageErr error
	if len(errs) > 0 {
		pageErr = errors.New(strings.Join(errs, "; "))
	}
	h.render(w, r, http.StatusOK, "rules", "Rules", v, pageErr)
}

// usageView is the Usage page's data: the table, and a bar chart of the
// admitted and denied items per day, stacked by domain.
type usageView struct {
	Usage Usage
	Bars  []usageBar
	Max   int64
}

// usageBar is one day of the Usage page's chart.
type usageBar struct {
	Date             string
	Admitted, Denied int64
	X                int     // left edge, px
	HA, HD           float64 // heights, px
}

func (h *Handler) usage(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := h.ctx(r)
	defer cancel()
	u, err := h.cfg.Backend.Usage(ctx, 14)
	v := usageView{Usage: u}
	byDate := map[string]*usageBar{}
	var dates []string
	for _, d := range u.Days {
		b := byDate[d.Date]
		if b == nil {
			b = &usageBar{Date: d.Date}
			byDate[d.Date] = b
			dates = append(dates, d.Date)
		}
		b.Admitted += d.Admitted
		b.Denied += d.Denied
	}
	slices.Sort(dates)
	for _, d := range dates {
		v.Max = max(v.Max, byDate[d].Admitted+byDate[d].Denied)
	}
	for i, d := range dates {
		b := *byDate[d]
		b.X = 40 + i*44
		if v.Max > 0 {
			b.HA = 160 * float64(b.Admitted) / float64(v.Max)
			b.HD = 160 * float64(b.Denied) / float64(v.Max)
		}
		v.Bars = append(v.Bars, b)
	}
	h.render(w, r, http.StatusOK, "usage", "Usage", v, err)
}

// statusMessage is an error's gRPC message, or its text.
func statusMessage(err error) string {
	if s, ok := status.FromError(err); ok {
		return s.Message()
	}
	return err.Error()
}

// fmtMs formats a unix-ms time as the console shows times: UTC, to the ms.
func fmtMs(ms int64) string {
	if ms == 0 {
		return "—"
	}
	return time.UnixMilli(ms).UTC().Format("2006-01-02 15:04:05.000Z")
}

// fmtDur formats ms milliseconds as a Go duration.
func fmtDur(ms int64) string { return (time.Duration(ms) * time.Millisecond).String() }
