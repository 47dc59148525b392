// Package rules turns a rules file into an immutable rule set: it parses and
// validates the YAML (errors read "file:line: domain, rule, field and value"),
// holds the embedded default rules (Huawei Cloud's published SMS
// limits), and gives each set a stable hash that nodes compare across a
// cluster.
//
// A rules file is a list of domains (rule sets), each a list of rules:
//
//	domains:
//	  - name: default
//	    rules:
//	      - name: recipient-1m      # unique within the domain
//	        scope: recipient        # recipient | recipient+content
//	        limit: 15               # [1, window.MaxLimit]
//	        window: 1m              # a Go duration, whole ms, [1ms, window.MaxWindow]
//	  - name: api-ip
//	    rules:
//	      - name: hourly
//	        algorithm: sliding-counter # sliding-log (default) | sliding-counter | token-bucket |
//	                                   # leaky-bucket | gcra | fixed-window (window.Algorithm)
//	        limit: 10000            # [1, window.MaxCounterLimit] for a counting algorithm
//	        window: 1h
//	        buckets: 60             # sliding-counter only: sub-windows (default 60)
//	      - name: burst
//	        algorithm: gcra
//	        limit: 100              # a bucket drains, or refills, limit per window
//	        window: 1m
//	        capacity: 20            # bucket algorithms only: the burst (default: the limit)
//	      - name: daily
//	        algorithm: fixed-window
//	        limit: 1000
//	        window: 24h
//	        borrow: 300             # fixed-window only: may admit 300 ahead, repaid later (default 0)
//	      - name: per-local-day
//	        algorithm: fixed-window
//	        limit: 3
//	        calendar: day           # fixed-window only: hour | day | week | month, in place of window
//	        zone: America/New_York  # calendar rules only: a tz database name (default UTC)
//
// A counting algorithm counts per key (scope recipient, which may be left
// out); a parameter set for an algorithm that has no such parameter is an
// error naming the field.
//
// Unknown fields are errors. A Set is immutable and safe for concurrent use;
// a reload builds a new one. The package imports window and yaml only.
package rules
