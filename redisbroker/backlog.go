package redisbroker

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/spillway-go/spillway/cost"
)

// backlogSampleEntries is how many entries one backlog estimate reads per
// stream at most from each end of the undelivered entries, and from the
// pending ones.
const backlogSampleEntries = 1000

// backlogScript reads group ARGV[1]'s position in stream KEYS[1] (XINFO
// GROUPS: its lag, or -1 when Redis cannot tell, and its pending count) and
// then the vertex_count metadata value and the payload length of up to
// ARGV[2] entries after the group's last-delivered ID (the oldest
// undelivered), of up to ARGV[2] entries more from the end of the stream
// (the newest, when there are more), and of up to ARGV[2] pending
// entries, all at one point in time. It returns lag, pending, then per
// entry read: kind (0 oldest undelivered, 1 pending, 2 newest), count (""
// when absent), payload length. Only these few bytes per entry leave the
// server.
var backlogScript = redis.NewScript(`
local lag, pending, last = -1, 0, nil
for _, g in ipairs(redis.call("XINFO", "GROUPS", KEYS[1])) do
  local f = {}
  for i = 1, #g, 2 do f[g[i]] = g[i + 1] end
  if f["name"] == ARGV[1] then
    if type(f["lag"]) == "number" then lag = f["lag"] end
    pending, last = f["pending"], f["last-delivered-id"]
  end
end
if last == nil then
  return redis.error_reply("NOGROUP no such consumer group")
end
local out = {lag, pending}
local function add(kind, entry)
  local fields = entry[2]
  local count, plen = "", 0
  for i = 1, #fields, 2 do
    local k, v = fields[i], fields[i + 1]
    if k == "payload" then
      plen = string.len(v)
    elseif k == "metadata" then
      local ok, md = pcall(cmsgpack.unpack, v)
      if ok and type(md) == "table" and type(md["vertex_count"]) == "string" then
        count = md["vertex_count"]
      end
    end
  end
  out[#out + 1] = kind
  out[#out + 1] = count
  out[#out + 1] = plen
end
local head = redis.call("XRANGE", KEYS[1], "(" .. last, "+", "COUNT", ARGV[2])
for _, e in ipairs(head) do
  add(0, e)
end
if #head == tonumber(ARGV[2]) then
  for _, e in ipairs(redis.call("XREVRANGE", KEYS[1], "+", "(" .. head[#head][1], "COUNT", ARGV[2])) do
    add(2, e)
  end
end
for _, p in ipairs(redis.call("XPENDING", KEYS[1], ARGV[1], "-", "+", ARGV[2])) do
  local es = redis.call("XRANGE", KEYS[1], p[1], p[1])
  if #es == 1 then
    add(1, es[1])
  end
end
return out
`)

// BacklogVertices estimates the vertices of the group's backlog on topic,
// the entries [Subscriber.Lag] counts, from their vertex_count: it reads
// up to 1,000 of the oldest undelivered entries, up to 1,000 of the newest
// and up to 1,000 pending entries, in one XINFO GROUPS and one script run
// (XRANGE, XREVRANGE, XPENDING; only the counts leave the server).
// An entry without a valid vertex_count counts as unstamped vertices: pass
// what the consumer's budget charges it (the router passes
// budget.default_cost, or the whole budget). Entries not read, between the
// oldest and the newest read, are taken to cost the mean of the two ends'
// averages. sampled is how many entries
// were read; the estimate is exact when sampled equals the lag. Call it
// from time to time, not per message.
func (s *Subscriber) BacklogVertices(ctx context.Context, topic string, unstamped int64) (vertices, sampled int64, err error) {
	info, err := s.lagInfo(ctx, topic)
	if err != nil {
		return 0, 0, err
	}
	if info.backlog() == 0 {
		return 0, 0, nil
	}
	res, err := backlogScript.Run(ctx, s.control, []string{topic}, s.cfg.ConsumerGroup, backlogSampleEntries).Slice()
	if err != nil {
		return 0, 0, fmt.Errorf("redisbroker: backlog of %q: %w", topic, err)
	}
	if len(res) < 2 {
		return 0, 0, fmt.Errorf("redisbroker: backlog of %q: short script reply", topic)
	}
	lag, _ := res[0].(int64)
	pending, _ := res[1].(int64)
	var parts [3]countSample // oldest undelivered, pending, newest undelivered
	for i := 2; i+2 < len(res); i += 3 {
		kind, _ := res[i].(int64)
		value, _ := res[i+1].(string)
		plen, _ := res[i+2].(int64)
		if kind < 0 || kind > 2 {
			continue
		}
		parts[kind].add(value, int(plen), unstamped)
	}
	oldest, pend, newest := parts[0], parts[1], parts[2]
	undelivered := max(lag, oldest.read+newest.read)
	middle := undelivered - oldest.read - newest.read
	sampled = oldest.read + newest.read + min(pend.read, pending)
	v := oldest.total() + newest.total() + pend.scaled(pending)
	if middle > 0 {
		var mean float64
		switch {
		case oldest.read > 0 && newest.read > 0:
			mean = (oldest.mean() + newest.mean()) / 2
		case oldest.read > 0:
			mean = oldest.mean()
		default:
			mean = newest.mean()
		}
		v += mean * float64(middle)
	}
	return int64(v), sampled, nil
}

// countSample is the vertex_count of some entries read: how many were read
// and the sum of their counts.
type countSample struct {
	read, sum int64
}

// add counts an entry whose vertex_count is value, unstamped if it has
// no valid one.
func (c *countSample) add(value string, payloadLen int, unstamped int64) {
	c.read++
	if v, src := cost.ParseCount(value, payloadLen); src == cost.SourceHeader {
		c.sum += v
	} else {
		c.sum += unstamped
	}
}

// mean is the average count of the entries read; 0 if none were.
func (c countSample) mean() float64 {
	if c.read == 0 {
		return 0
	}
	return float64(c.sum) / float64(c.read)
}

// total is the sum of the entries read.
func (c countSample) total() float64 { return float64(c.sum) }

// scaled is the sum scaled to n entries: exact when every one of them was
// read.
func (c countSample) scaled(n int64) float64 {
	if c.read >= n {
		return float64(c.sum)
	}
	return c.mean() * float64(n)
}
