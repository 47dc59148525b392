package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"strings"
	"text/tabwriter"
)

// WriteTable prints the reports side by side: one row per target, and the
// ratios of the first target to each other one.
func WriteTable(w io.Writer, reports []*Report) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "target\tmode\tbatch\tdecisions/s\tp50 ms\tp90 ms\tp99 ms\tp99.9 ms\tmax ms\tadmitted\tdenied\terrors\tdegraded\tB/recipient\tover-admitted\t")
	for _, r := range reports {
		over := fmt.Sprintf("%d of %d", r.OverAdmissions, r.Audited)
		if r.AuditSkipped != "" {
			over = "not audited"
		}
		bpr := "-"
		if r.BytesPerRecipient > 0 {
			bpr = fmt.Sprintf("%.0f", r.BytesPerRecipient)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%.0f\t%.3f\t%.3f\t%.3f\t%.3f\t%.3f\t%d\t%d\t%d\t%d\t%s\t%s\t\n",
			r.Target, r.Mode, r.Batch, r.PerSecond, r.Latency.P50, r.Latency.P90, r.Latency.P99, r.Latency.P999, r.Latency.Max,
			r.Admitted, r.Denied, r.Errors, r.Degraded, bpr, over)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, r := range reports {
		if r.StartLateness != (Latency{}) {
			fmt.Fprintf(w, "\n%s, %s: calls started behind their time by p50 / p90 / p99 %.3f / %.3f / %.3f ms; from their actual start they took %.3f / %.3f / %.3f ms\n",
				r.Target, r.Mode, r.StartLateness.P50, r.StartLateness.P90, r.StartLateness.P99, r.Service.P50, r.Service.P90, r.Service.P99)
		}
	}
	if len(reports) < 2 {
		return nil
	}
	a := reports[0]
	fmt.Fprintln(w)
	for _, b := range reports[1:] {
		fmt.Fprintf(w, "%s vs %s: %s decisions/s, %s p99 latency", a.Target, b.Target,
			ratio(a.PerSecond, b.PerSecond, "×"), ratio(b.Latency.P99, a.Latency.P99, "× lower"))
		if a.BytesPerRecipient > 0 && b.BytesPerRecipient > 0 {
			fmt.Fprintf(w, ", %s memory per recipient", ratio(b.BytesPerRecipient, a.BytesPerRecipient, "× smaller"))
		}
		fmt.Fprintln(w)
	}
	return nil
}

func ratio(x, y float64, unit string) string {
	if y == 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.1f%s", x/y, unit)
}

// WriteJSON writes the reports to path as indented JSON.
func WriteJSON(path string, reports []*Report) error {
	b, err := json.MarshalIndent(reports, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// WriteSVG draws the reports on one page: decisions/s over time, p99 call
// latency over time, and the latency distribution of each target.
func WriteSVG(path string, reports []*Report) error {
	const width, panelH, gap = 900, 260, 70
	colors := []string{"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e"}
	var b strings.Builder
	h := 3*(panelH+gap) + 40
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">`+"\n", width, h)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	panel := func(top int, title, xlabel, ylabel string, ss []series, logY bool, xticks []float64, xtickLabel func(float64) string) {
		left, right := 80.0, float64(width-160)
		y0, y1 := float64(top+panelH), float64(top+20)
		var xmin, xmax, ymin, ymax = math.Inf(1), math.Inf(-1), math.Inf(1), math.Inf(-1)
		for _, s := range ss {
			for i := range s.xs {
				xmin, xmax = math.Min(xmin, s.xs[i]), math.Max(xmax, s.xs[i])
				ymin, ymax = math.Min(ymin, s.ys[i]), math.Max(ymax, s.ys[i])
			}
		}
		if math.IsInf(xmin, 0) {
			return
		}
		if xmax == xmin {
			xmax = xmin + 1
		}
		ymin = 0
		if logY {
			ymin = math.Max(1e-3, math.Pow(10, math.Floor(math.Log10(math.Max(1e-3, minPositive(ss))))))
			ymax = math.Pow(10, math.Ceil(math.Log10(math.Max(ymax, ymin*10))))
		} else {
			ymax = niceCeil(ymax)
		}
		fy := func(y float64) float64 {
			if logY {
				y = math.Max(y, ymin)
				return y0 - (math.Log10(y)-math.Log10(ymin))/(math.Log10(ymax)-math.Log10(ymin))*(y0-y1)
			}
			return y0 - (y-ymin)/(ymax-ymin)*(y0-y1)
		}
		fx := func(x float64) float64 { return left + (x-xmin)/(xmax-xmin)*(right-left) }
		fmt.Fprintf(&b, `<text x="%d" y="%d" font-size="14" font-weight="bold">%s</text>`+"\n", int(left), top+10, title)
		fmt.Fprintf(&b, `<rect x="%.0f" y="%.0f" width="%.0f" height="%.0f" fill="none" stroke="#999"/>`+"\n", left, y1, right-left, y0-y1)
		// y ticks
		var yt []float64
		if logY {
			for v := ymin; v <= ymax*1.0001; v *= 10 {
				yt = append(yt, v)
			}
		} else {
			for i := range 5 {
				yt = append(yt, ymin+(ymax-ymin)*float64(i)/4)
			}
		}
		for _, v := range yt {
			fmt.Fprintf(&b, `<line x1="%.0f" x2="%.0f" y1="%.1f" y2="%.1f" stroke="#eee"/><text x="%.0f" y="%.1f" text-anchor="end">%s</text>`+"\n",
				left, right, fy(v), fy(v), left-6, fy(v)+4, humanNumber(v))
		}
		for _, x := range xticks {
			if x < xmin || x > xmax {
				continue
			}
			fmt.Fprintf(&b, `<text x="%.1f" y="%.0f" text-anchor="middle">%s</text>`+"\n", fx(x), y0+16, xtickLabel(x))
		}
		fmt.Fprintf(&b, `<text x="%.0f" y="%.0f" text-anchor="middle">%s</text>`+"\n", (left+right)/2, y0+34, xlabel)
		fmt.Fprintf(&b, `<text x="16" y="%.0f" transform="rotate(-90 16 %.0f)" text-anchor="middle">%s</text>`+"\n", (y0+y1)/2, (y0+y1)/2, ylabel)
		for i, s := range ss {
			c := colors[i%len(colors)]
			var pts []string
			for k := range s.xs {
				pts = append(pts, fmt.Sprintf("%.1f,%.1f", fx(s.xs[k]), fy(s.ys[k])))
			}
			dash := "" // later series dashed, so that equal lines stay visible
			if i > 0 {
				dash = fmt.Sprintf(` stroke-dasharray="%d,4"`, 4+4*i)
			}
			fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2" stroke-opacity="0.85"%s points="%s"/>`+"\n", c, dash, strings.Join(pts, " "))
			fmt.Fprintf(&b, `<rect x="%.0f" y="%d" width="12" height="12" fill="%s"/><text x="%.0f" y="%d">%s</text>`+"\n",
				right+12, top+24+i*18, c, right+30, top+34+i*18, s.name)
		}
	}
	var thr, p99, dist []series
	var maxT float64
	for _, r := range reports {
		var s1, s2 series
		s1.name, s2.name = r.Target, r.Target
		for _, sec := range r.Series {
			s1.xs, s1.ys = append(s1.xs, float64(sec.T)), append(s1.ys, float64(sec.Decisions))
			s2.xs, s2.ys = append(s2.xs, float64(sec.T)), append(s2.ys, sec.P99)
			maxT = math.Max(maxT, float64(sec.T))
		}
		thr, p99 = append(thr, s1), append(p99, s2)
		var s3 series
		s3.name = r.Target
		for _, p := range r.Percentiles {
			if p[0] >= 100 {
				continue
			}
			s3.xs, s3.ys = append(s3.xs, nines(p[0])), append(s3.ys, p[1])
		}
		dist = append(dist, s3)
	}
	var tt []float64
	for t := 0.0; t <= maxT; t += math.Max(1, math.Ceil(maxT/10)) {
		tt = append(tt, t)
	}
	secLabel := func(x float64) string { return fmt.Sprintf("%.0f", x) }
	panel(20, "Throughput", "seconds", "decisions/s", thr, false, tt, secLabel)
	panel(20+panelH+gap, "p99 call latency per second", "seconds", "ms (log)", p99, true, tt, secLabel)
	pt := []float64{0, nines(50), nines(90), nines(99), nines(99.9), nines(99.99)}
	panel(20+2*(panelH+gap), "Latency distribution", "percentile", "ms (log)", dist, true, pt, func(x float64) string {
		return fmt.Sprintf("%g%%", math.Round((1-math.Pow(10, -x))*1e6)/1e4)
	})
	b.WriteString("</svg>\n")
	return os.WriteFile(path, []byte(b.String()), 0o644)
}

// nines maps a percentile to the number of nines (50% -> 0.3, 99% -> 2).
func nines(p float64) float64 { return -math.Log10(1 - p/100) }

// series is one line of a chart.
type series struct {
	name   string
	xs, ys []float64
}

func minPositive(ss []series) float64 {
	m := math.Inf(1)
	for _, s := range ss {
		for _, y := range s.ys {
			if y > 0 {
				m = math.Min(m, y)
			}
		}
	}
	if math.IsInf(m, 1) {
		return 1
	}
	return m
}

func niceCeil(v float64) float64 {
	if v <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 2.5, 5, 10} {
		if v <= m*p {
			return m * p
		}
	}
	return 10 * p
}

func humanNumber(v float64) string {
	switch {
	case v >= 1e6:
		return fmt.Sprintf("%gM", math.Round(v/1e4)/100)
	case v >= 1e3:
		return fmt.Sprintf("%gk", math.Round(v/10)/100)
	case v >= 1:
		return fmt.Sprintf("%g", math.Round(v*100)/100)
	}
	return fmt.Sprintf("%g", v)
}
