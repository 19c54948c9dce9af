-- enqueue: one job, as enqueue_job.lua (loaded in front of this) says, its keys and arguments packed.
-- KEYS: enqueue_job's
-- ARGV: enqueue_job's
-- Reply: enqueue_job's

return enqueue_job(KEYS, ARGV, true)
