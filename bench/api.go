package bench

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/freqring/freqring/rules"
	"github.com/freqring/freqring/window"
)

// The seed 004 workload: an open platform's API calls. Every call names an
// app, a client IP, a user and an interface, and is two checks:
//
//   - the key app\x1fip in domain "api-ip": 10,000 calls an hour per (app, ip);
//   - the key app\x1fuser\x1finterface in domain "api-user": 1,000 calls an
//     hour per (app, user, interface).
//
// The call is allowed only if both admit. In freqring the two keys live on
// whichever nodes own them: the two checks are independent decisions, not
// one atomic step, and each key records its own admitted check whatever the
// other key decided (a call denied by one key still uses the other key's
// quota, unless APIFreqringTarget refunds it). The Redis designs run both
// keys in one Lua script on one server, atomically: a call records on both
// keys or on neither. The oracle audits, per key, the sends each limiter
// recorded on it (AuditKeys).

// Domains of the seed 004 workload.
const (
	APIIPDomain   = "api-ip"
	APIUserDomain = "api-user"
)

// KeySep joins the parts of a key of several parts.
const KeySep = "\x1f"

// APIWorkload is the seed 004 traffic. It is deterministic for a given
// Seed. A zero field takes the default in its comment.
type APIWorkload struct {
	Apps       int     // 0 means 100
	IPs        int     // 0 means 10,000
	Users      int     // 0 means 100,000
	Interfaces int     // 0 means 50
	Zipf       float64 // skew of every dimension: 0 means 1.1 (Zipf's s), negative uniform
	Seed       uint64  // 0 means 1
}

func (w *APIWorkload) fill() {
	def := func(p *int, v int) {
		if *p == 0 {
			*p = v
		}
	}
	def(&w.Apps, 100)
	def(&w.IPs, 10_000)
	def(&w.Users, 100_000)
	def(&w.Interfaces, 50)
	if w.Zipf == 0 {
		w.Zipf = 1.1
	}
	if w.Seed == 0 {
		w.Seed = 1
	}
}

func (w *APIWorkload) validate() error {
	for _, f := range []struct {
		name string
		n    int
	}{{"Apps", w.Apps}, {"IPs", w.IPs}, {"Users", w.Users}, {"Interfaces", w.Interfaces}} {
		if f.n < 1 || f.n > 1<<30 {
			return fmt.Errorf("bench: %s %d out of range [1, %d]", f.name, f.n, 1<<30)
		}
	}
	if w.Apps > 1<<16 || w.Interfaces > 1<<16 {
		return fmt.Errorf("bench: Apps %d and Interfaces %d: at most %d each", w.Apps, w.Interfaces, 1<<16)
	}
	if w.Zipf > 0 && w.Zipf <= 1 {
		return fmt.Errorf("bench: Zipf %g: want s > 1, or negative for uniform", w.Zipf)
	}
	return nil
}

// Call is one API call, by index into each population.
type Call struct {
	App, IP, User uint32
	Interface     uint16
}

// AppName, IPName, UserName and InterfaceName name the populations' members.
func AppName(i uint32) string { return "app" + strconv.FormatUint(uint64(i), 10) }
func IPName(i uint32) string {
	return fmt.Sprintf("10.%d.%d.%d", byte(i>>16), byte(i>>8), byte(i))
}
func UserName(i uint32) string      { return "u" + strconv.FormatUint(uint64(i), 10) }
func InterfaceName(i uint16) string { return "if" + strconv.FormatUint(uint64(i), 10) }
func (c Call) IPKey() string        { return AppName(c.App) + KeySep + IPName(c.IP) }

// ipKey and userKey pack the keys for the oracle.
func (c Call) ipKey() uint64   { return uint64(c.App)<<32 | uint64(c.IP) }
func (c Call) userKey() uint64 { return uint64(c.App)<<48 | uint64(c.Interface)<<32 | uint64(c.User) }

func (c Call) UserKey() string {
	return AppName(c.App) + KeySep + UserName(c.User) + KeySep + InterfaceName(c.Interface)
}

// apiGenerator draws calls; one per worker.
type apiGenerator struct {
	w                    APIWorkload
	rng                  *rand.Rand
	app, ip, user, iface *rand.Zipf
}

func (w *APIWorkload) generator(worker int) *apiGenerator {
	g := &apiGenerator{w: *w, rng: rand.New(rand.NewPCG(w.Seed, uint64(worker)+1))}
	if w.Zipf > 1 {
		z := func(n int) *rand.Zipf {
			if n < 2 {
				return nil
			}
			return rand.NewZipf(g.rng, w.Zipf, 1, uint64(n-1))
		}
		g.app, g.ip, g.user, g.iface = z(w.Apps), z(w.IPs), z(w.Users), z(w.Interfaces)
	}
	return g
}

// draw returns a member of a population of n: by Zipf rank, scattered so
// that popular members are not neighbours, or uniform.
func (g *apiGenerator) draw(z *rand.Zipf, n int) uint32 {
	if z == nil {
		return uint32(g.rng.IntN(n))
	}
	return uint32((z.Uint64()*0x9e3779b1 + 7) % uint64(n))
}

func (g *apiGenerator) next() Call {
	return Call{
		App:       g.draw(g.app, g.w.Apps),
		IP:        g.draw(g.ip, g.w.IPs),
		User:      g.draw(g.user, g.w.Users),
		Interface: uint16(g.draw(g.iface, g.w.Interfaces)),
	}
}

// APIRules are the two rules of the seed 004 workload.
type APIRules struct {
	IP, User window.Rule
}

// DefaultAPIRules returns seed 004's limits, 10,000 calls an hour per (app,
// ip) and 1,000 per (app, user, interface), with algorithm alg:
// window.FixedWindow is seed 004's Redis design (a counter per aligned
// hour), window.SlidingCounter seed 003's (60 sub-windows of a minute); the
// buckets (token-bucket, leaky-bucket, gcra) hold the limit and drain it
// over the hour, and have no Redis design in the seeds.
func DefaultAPIRules(alg window.Algorithm) APIRules {
	r := APIRules{
		IP:   window.Rule{Name: "app-ip-hour", Scope: window.ScopeRecipient, Limit: 10_000, Window: time.Hour, Algorithm: alg},
		User: window.Rule{Name: "app-user-interface-hour", Scope: window.ScopeRecipient, Limit: 1_000, Window: time.Hour, Algorithm: alg},
	}
	if alg == window.SlidingCounter {
		r.IP.Buckets, r.User.Buckets = 60, 60
	}
	return r
}

// apiAlgorithms are the algorithms the api workload runs.
const apiAlgorithms = "fixed-window, sliding-counter, token-bucket, leaky-bucket, gcra"

// Validate checks both rules.
func (r APIRules) Validate() error {
	for _, x := range []window.Rule{r.IP, r.User} {
		if err := x.Validate(); err != nil {
			return err
		}
		if x.Algorithm == window.SlidingLog {
			return fmt.Errorf("bench: rule %s: algorithm %v; the api workload takes a counting algorithm (%s)", x.Name, x.Algorithm, apiAlgorithms)
		}
	}
	return nil
}

// YAML returns a rules file with the two domains.
func (r APIRules) YAML() []byte {
	rule := func(x window.Rule) string {
		s := fmt.Sprintf("{name: %s, algorithm: %s, limit: %d, window: %s", x.Name, x.Algorithm, x.Limit, x.Window)
		if x.Buckets != 0 {
			s += fmt.Sprintf(", buckets: %d", x.Buckets)
		}
		if x.Capacity != 0 {
			s += fmt.Sprintf(", capacity: %d", x.Capacity)
		}
		if x.Borrow != 0 {
			s += fmt.Sprintf(", borrow: %d", x.Borrow)
		}
		return s + "}"
	}
	return fmt.Appendf(nil, "domains:\n  - name: %s\n    rules:\n      - %s\n  - name: %s\n    rules:\n      - %s\n",
		APIIPDomain, rule(r.IP), APIUserDomain, rule(r.User))
}

// RuleSet parses YAML into a rule set, for nodes.
func (r APIRules) RuleSet() (*rules.Set, error) {
	if err := r.Validate(); err != nil {
		return nil, err
	}
	return rules.Parse("api rules", r.YAML())
}
