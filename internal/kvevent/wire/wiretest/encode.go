// Package wiretest encodes KV-event batches byte for byte as the engines'
// msgspec encoders do, for golden tests, fuzz seeds and benchmarks. It
// follows msgspec's rules (jcrist/msgspec _core.c): integers and strings in
// their smallest form, floats always float64, array_like structs write every
// field, map structs write the tag first, omit fields equal to their None
// default, and size the map header by the number of possible keys.
package wiretest

import (
	"encoding/binary"
	"fmt"
	"math"
)

// KV is one key of a Map.
type KV struct {
	K string
	V any
}

// Map is an ordered msgpack map. Width is the number of keys msgspec
// reserves the header for (fields + tag); 0 means len(KVs).
type Map struct {
	Width int
	KVs   []KV
}

// Encode encodes nil, bool, int, int64, uint64, uint32, float64, string,
// []byte, []any, []uint32, []uint64 and Map.
func Encode(v any) []byte { return Append(nil, v) }

// Append appends the encoding of v to b.
func Append(b []byte, v any) []byte {
	switch x := v.(type) {
	case nil:
		return append(b, 0xc0)
	case bool:
		if x {
			return append(b, 0xc3)
		}
		return append(b, 0xc2)
	case int:
		return appendInt(b, int64(x))
	case int64:
		return appendInt(b, x)
	case uint32:
		return appendUint(b, uint64(x))
	case uint64:
		return appendUint(b, x)
	case float64:
		b = append(b, 0xcb)
		return binary.BigEndian.AppendUint64(b, math.Float64bits(x))
	case string:
		n := len(x)
		switch {
		case n < 32:
			b = append(b, 0xa0|byte(n))
		case n < 1<<8:
			b = append(b, 0xd9, byte(n))
		case n < 1<<16:
			b = append(b, 0xda)
			b = binary.BigEndian.AppendUint16(b, uint16(n))
		default:
			b = append(b, 0xdb)
			b = binary.BigEndian.AppendUint32(b, uint32(n))
		}
		return append(b, x...)
	case []byte:
		n := len(x)
		switch {
		case n < 1<<8:
			b = append(b, 0xc4, byte(n))
		case n < 1<<16:
			b = append(b, 0xc5)
			b = binary.BigEndian.AppendUint16(b, uint16(n))
		default:
			b = append(b, 0xc6)
			b = binary.BigEndian.AppendUint32(b, uint32(n))
		}
		return append(b, x...)
	case []any:
		b = ArrayHeader(b, len(x))
		for _, e := range x {
			b = Append(b, e)
		}
		return b
	case []uint32:
		b = ArrayHeader(b, len(x))
		for _, e := range x {
			b = appendUint(b, uint64(e))
		}
		return b
	case []uint64:
		b = ArrayHeader(b, len(x))
		for _, e := range x {
			b = appendUint(b, e)
		}
		return b
	case Map:
		w := x.Width
		if w < len(x.KVs) {
			w = len(x.KVs)
		}
		n := len(x.KVs)
		switch {
		case w < 16:
			b = append(b, 0x80|byte(n))
		case w < 1<<16:
			b = append(b, 0xde)
			b = binary.BigEndian.AppendUint16(b, uint16(n))
		default:
			b = append(b, 0xdf)
			b = binary.BigEndian.AppendUint32(b, uint32(n))
		}
		for _, kv := range x.KVs {
			b = Append(b, kv.K)
			b = Append(b, kv.V)
		}
		return b
	}
	panic(fmt.Sprintf("wiretest: cannot encode %T", v))
}

// ArrayHeader appends an array header for n elements.
func ArrayHeader(b []byte, n int) []byte {
	switch {
	case n < 16:
		return append(b, 0x90|byte(n))
	case n < 1<<16:
		b = append(b, 0xdc)
		return binary.BigEndian.AppendUint16(b, uint16(n))
	}
	b = append(b, 0xdd)
	return binary.BigEndian.AppendUint32(b, uint32(n))
}

func appendUint(b []byte, v uint64) []byte {
	switch {
	case v < 128:
		return append(b, byte(v))
	case v < 1<<8:
		return append(b, 0xcc, byte(v))
	case v < 1<<16:
		b = append(b, 0xcd)
		return binary.BigEndian.AppendUint16(b, uint16(v))
	case v < 1<<32:
		b = append(b, 0xce)
		return binary.BigEndian.AppendUint32(b, uint32(v))
	}
	b = append(b, 0xcf)
	return binary.BigEndian.AppendUint64(b, v)
}

func appendInt(b []byte, v int64) []byte {
	switch {
	case v >= 0:
		return appendUint(b, uint64(v))
	case v >= -32:
		return append(b, byte(int8(v)))
	case v >= math.MinInt8:
		return append(b, 0xd0, byte(int8(v)))
	case v >= math.MinInt16:
		b = append(b, 0xd1)
		return binary.BigEndian.AppendUint16(b, uint16(int16(v)))
	case v >= math.MinInt32:
		b = append(b, 0xd2)
		return binary.BigEndian.AppendUint32(b, uint32(int32(v)))
	}
	b = append(b, 0xd3)
	return binary.BigEndian.AppendUint64(b, uint64(v))
}
