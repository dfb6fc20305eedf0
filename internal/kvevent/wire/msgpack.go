package wire

import (
	"encoding/binary"
	"math"
)

// reader is a bounds-checked cursor over one msgpack payload. Every method
// checks the remaining length before it reads, so a truncated or hostile
// payload yields an error, never a panic or an allocation sized by the input.
type reader struct {
	b []byte
	i int
}

func (r *reader) remaining() int { return len(r.b) - r.i }

func (r *reader) peek() (byte, error) {
	if r.i >= len(r.b) {
		return 0, errTruncated
	}
	return r.b[r.i], nil
}

func (r *reader) take(n int) ([]byte, error) {
	if n < 0 || n > r.remaining() {
		return nil, errTruncated
	}
	s := r.b[r.i : r.i+n : r.i+n]
	r.i += n
	return s, nil
}

func (r *reader) u8() (byte, error) {
	if r.i >= len(r.b) {
		return 0, errTruncated
	}
	c := r.b[r.i]
	r.i++
	return c, nil
}

func (r *reader) be(n int) (uint64, error) {
	s, err := r.take(n)
	if err != nil {
		return 0, err
	}
	switch n {
	case 1:
		return uint64(s[0]), nil
	case 2:
		return uint64(binary.BigEndian.Uint16(s)), nil
	case 4:
		return uint64(binary.BigEndian.Uint32(s)), nil
	default:
		return binary.BigEndian.Uint64(s), nil
	}
}

// nextIsNil consumes a nil (0xc0) if one is next.
func (r *reader) nextIsNil() bool {
	if r.i < len(r.b) && r.b[r.i] == 0xc0 {
		r.i++
		return true
	}
	return false
}

// arrayHeader reads an array header. The element count is checked against
// the bytes left (every element takes at least one byte), so a header cannot
// make a caller allocate more than the payload could hold.
func (r *reader) arrayHeader() (int, error) { return r.header(0x90, 0xdc, 0xdd, 1) }

// mapHeader reads a map header, with the same bound as arrayHeader (two
// bytes at least per entry).
func (r *reader) mapHeader() (int, error) { return r.header(0x80, 0xde, 0xdf, 2) }

// header reads a container header whose fixed form is fix..fix+15 and whose
// 16- and 32-bit forms are c16 and c32, and bounds the count by the bytes
// left, each entry taking at least perEntry bytes.
func (r *reader) header(fix, c16, c32 byte, perEntry uint64) (int, error) {
	c, err := r.u8()
	if err != nil {
		return 0, err
	}
	var n uint64
	switch {
	case c >= fix && c <= fix|0x0f:
		n = uint64(c & 0x0f)
	case c == c16:
		n, err = r.be(2)
	case c == c32:
		n, err = r.be(4)
	default:
		r.i--
		return 0, errType
	}
	if err != nil {
		return 0, err
	}
	if n > uint64(r.remaining())/perEntry {
		return 0, errTruncated
	}
	return int(n), nil
}

// isMap reports whether the next value is a map.
func (r *reader) isMap() bool {
	if r.i >= len(r.b) {
		return false
	}
	c := r.b[r.i]
	return (c >= 0x80 && c <= 0x8f) || c == 0xde || c == 0xdf
}

// str reads a str (or, tolerantly, a bin) and returns a view into the payload.
func (r *reader) str() ([]byte, error) {
	c, err := r.u8()
	if err != nil {
		return nil, err
	}
	var n uint64
	switch {
	case c >= 0xa0 && c <= 0xbf:
		n = uint64(c & 0x1f)
	case c == 0xd9 || c == 0xc4:
		n, err = r.be(1)
	case c == 0xda || c == 0xc5:
		n, err = r.be(2)
	case c == 0xdb || c == 0xc6:
		n, err = r.be(4)
	default:
		r.i--
		return nil, errType
	}
	if err != nil {
		return nil, err
	}
	if n > uint64(r.remaining()) {
		return nil, errTruncated
	}
	return r.take(int(n))
}

// intBits reads any msgpack integer and returns its 64-bit two's-complement
// pattern, and whether it was negative.
func (r *reader) intBits() (uint64, bool, error) {
	c, err := r.u8()
	if err != nil {
		return 0, false, err
	}
	switch {
	case c <= 0x7f:
		return uint64(c), false, nil
	case c >= 0xe0:
		return uint64(int64(int8(c))), true, nil
	}
	switch c {
	case 0xcc:
		v, err := r.be(1)
		return v, false, err
	case 0xcd:
		v, err := r.be(2)
		return v, false, err
	case 0xce:
		v, err := r.be(4)
		return v, false, err
	case 0xcf:
		v, err := r.be(8)
		return v, false, err
	case 0xd0:
		v, err := r.be(1)
		return uint64(int64(int8(v))), int8(v) < 0, err
	case 0xd1:
		v, err := r.be(2)
		return uint64(int64(int16(v))), int16(v) < 0, err
	case 0xd2:
		v, err := r.be(4)
		return uint64(int64(int32(v))), int32(v) < 0, err
	case 0xd3:
		v, err := r.be(8)
		return v, int64(v) < 0, err
	}
	r.i--
	return 0, false, errType
}

// int reads an integer that must fit an int64.
func (r *reader) int() (int64, error) {
	v, neg, err := r.intBits()
	if err != nil {
		return 0, err
	}
	if !neg && v > math.MaxInt64 {
		return 0, errRange
	}
	return int64(v), nil
}

// float reads a float32, float64 or an integer as a float64.
func (r *reader) float() (float64, error) {
	c, err := r.peek()
	if err != nil {
		return 0, err
	}
	switch c {
	case 0xca:
		r.i++
		v, err := r.be(4)
		return float64(math.Float32frombits(uint32(v))), err
	case 0xcb:
		r.i++
		v, err := r.be(8)
		return math.Float64frombits(v), err
	}
	v, err := r.int()
	return float64(v), err
}

// skip steps over one value of any type, nested at most depth levels.
func (r *reader) skip(depth int) error {
	if depth <= 0 {
		return errDepth
	}
	c, err := r.u8()
	if err != nil {
		return err
	}
	var n uint64
	switch {
	case c <= 0x7f || c >= 0xe0 || c == 0xc0 || c == 0xc2 || c == 0xc3:
		return nil
	case c >= 0xa0 && c <= 0xbf:
		_, err = r.take(int(c & 0x1f))
		return err
	case c >= 0x90 && c <= 0x9f:
		return r.skipN(int(c&0x0f), depth)
	case c >= 0x80 && c <= 0x8f:
		return r.skipN(2*int(c&0x0f), depth)
	}
	switch c {
	case 0xcc, 0xd0:
		_, err = r.take(1)
	case 0xcd, 0xd1:
		_, err = r.take(2)
	case 0xce, 0xd2, 0xca:
		_, err = r.take(4)
	case 0xcf, 0xd3, 0xcb:
		_, err = r.take(8)
	case 0xd4:
		_, err = r.take(2)
	case 0xd5:
		_, err = r.take(3)
	case 0xd6:
		_, err = r.take(5)
	case 0xd7:
		_, err = r.take(9)
	case 0xd8:
		_, err = r.take(17)
	case 0xc4, 0xd9:
		n, err = r.be(1)
		if err == nil {
			_, err = r.takeLen(n)
		}
	case 0xc5, 0xda:
		n, err = r.be(2)
		if err == nil {
			_, err = r.takeLen(n)
		}
	case 0xc6, 0xdb:
		n, err = r.be(4)
		if err == nil {
			_, err = r.takeLen(n)
		}
	case 0xc7, 0xc8, 0xc9: // ext 8/16/32: length, type byte, data
		w := 1
		switch c {
		case 0xc8:
			w = 2
		case 0xc9:
			w = 4
		}
		n, err = r.be(w)
		if err == nil {
			_, err = r.takeLen(n + 1)
		}
	case 0xdc, 0xdd:
		r.i--
		var k int
		k, err = r.arrayHeader()
		if err == nil {
			err = r.skipN(k, depth)
		}
	case 0xde, 0xdf:
		r.i--
		var k int
		k, err = r.mapHeader()
		if err == nil {
			err = r.skipN(2*k, depth)
		}
	default: // 0xc1 is never used
		return errType
	}
	return err
}

func (r *reader) takeLen(n uint64) ([]byte, error) {
	if n > uint64(r.remaining()) {
		return nil, errTruncated
	}
	return r.take(int(n))
}

func (r *reader) skipN(n, depth int) error {
	for k := 0; k < n; k++ {
		if err := r.skip(depth - 1); err != nil {
			return err
		}
	}
	return nil
}

// raw returns the bytes of the next value and steps over it.
func (r *reader) raw(depth int) ([]byte, error) {
	start := r.i
	if err := r.skip(depth); err != nil {
		return nil, err
	}
	return r.b[start:r.i:r.i], nil
}
