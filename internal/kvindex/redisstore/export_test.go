package redisstore

// SetOnCall makes s call f after each script call of a change with the
// step it ran; an error from f stops the change there (a crash).
func SetOnCall(s *Store, f func(step int) error) { s.onCall = f }
