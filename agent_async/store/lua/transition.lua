-- transition: move a non-terminal state to a new status; a terminal state is never overwritten.
-- KEYS: state, active, leases
-- ARGV: job id, new status, now ms, retention s, result json|'', error|'',
--       '1' to undo a start that never ran, the attempt it ends (0: any; lib.lua's transition_job)
-- Reply: 1 if the transition happened, 0 if the state is terminal or gone, -1 if that attempt is over.

return transition_job(KEYS[1], KEYS[2], KEYS[3], ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7] == '1',
                      tonumber(ARGV[8] or '0'))
