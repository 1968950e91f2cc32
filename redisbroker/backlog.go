package redisbroker

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/spillway-go/spillway/cost"
)

// backlogSampleEntries is how many undelivered entries, and how many
// pending ones, one backlog estimate reads per stream at most.
const backlogSampleEntries = 1000

// backlogScript reads group ARGV[1]'s position in stream KEYS[1] (XINFO
// GROUPS: its lag, or -1 when Redis cannot tell, and its pending count) and
// then the vertex_count metadata value and the payload length of up to
// ARGV[2] entries after the group's last-delivered ID and of up to ARGV[2]
// pending entries, all at one point in time. It returns lag, pending, then
// per entry read: kind (0 undelivered, 1 pending), count ("" when absent),
// payload length. Only these few bytes per entry leave the server.
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
for _, e in ipairs(redis.call("XRANGE", KEYS[1], "(" .. last, "+", "COUNT", ARGV[2])) do
  add(0, e)
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
// the entries [Subscriber.Lag] counts: it reads the vertex_count of up to
// 1,000 entries after the group's last-delivered ID and of up to 1,000
// pending entries, in one XINFO GROUPS and one script run (XINFO GROUPS,
// XRANGE, XPENDING; only the counts leave the server), and scales each
// part's average to its size. sampled is how many entries were read; the estimate is exact when
// sampled equals the lag. Call it from time to time, not per message.
func (s *Subscriber) BacklogVertices(ctx context.Context, topic string) (vertices, sampled int64, err error) {
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
	var sum, read, counted [2]int64
	for i := 2; i+2 < len(res); i += 3 {
		kind, _ := res[i].(int64)
		value, _ := res[i+1].(string)
		plen, _ := res[i+2].(int64)
		if kind != 0 && kind != 1 {
			continue
		}
		read[kind]++
		if v, src := cost.ParseCount(value, int(plen)); src == cost.SourceHeader {
			sum[kind] += v
			counted[kind]++
		}
	}
	sizes := [2]int64{max(lag, read[0]), pending}
	for k := range 2 {
		sampled += min(read[k], sizes[k])
		switch {
		case counted[k] == 0:
		case counted[k] >= sizes[k]:
			vertices += sum[k]
		default:
			vertices += int64(float64(sum[k]) / float64(counted[k]) * float64(sizes[k]))
		}
	}
	return vertices, sampled, nil
}
