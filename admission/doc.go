// Package admission is the path of a limited task from the worker slot
// asynq gave it to its handler, or back to its queue: its caps (package
// semaphore) and its rate limits (package ratelimit) rendered from its
// payload (Table), taken in one fixed order without holding a seat while
// it waits for another (Admitter.Admit, path.go), then held while it runs
// (Admission.Run). A task that cannot run now goes back as a Back, parked
// in the waiting room of the limit that held it back (package semaphore's
// rooms: a cap's, or a rate limit's paced room, which roomPace hands out
// at the limit's pace), and is brought to the dequeuing end of its queue
// when its turn comes (Waker, wake.go). A
// producer's Gate routes a new task the same way before it is enqueued
// (gate.go, pace.go).
//
// What a task costs Redis, counted with INFO commandstats on the
// benchmarks of SPEC §4 (commands inside scripts counted one by one):
//
//   - A cap that is not reached (S2): none of its own, beside asynq's
//     dequeue and done. The first task of a process takes, with its
//     seat (acquire.lua), spare seats for the next ones (up to the
//     worker's concurrency, never into the upper half of the key's
//     seats), which they take and give back in memory
//     (semaphore.Options.SpareSeats); the spare seats renew with one
//     call every TTL/3. Measured: 3 script calls a task, as bare
//     asynq's 3.
//   - A semaphore's own Acquire and Release (S3), or a task that finds
//     no spare seat, on a key nobody waits for: one call of quick.lua
//     to take (whether anybody waits, the server's time, the seats,
//     the seat and its lease, the fence: 6 or 7 commands; the lapsed
//     leases are dropped first only when they would refuse it), without
//     the waiting room's functions, and two plain commands to give back
//     (the seat's ZREM, then whether anybody waits; when the lease has
//     less than half its TTL to run, quick.lua with the clock and the
//     lease's expiry instead: 5 or 6), also once a take took the key's
//     last seat (semaphore/quick.go). Measured: 9 commands a cycle, 15
//     to 23 µs of Redis CPU (S3); 27.5 commands a task in all for S6's
//     tenants' caps of 2. On a key with waiters, a seat given back
//     while the process's own waiter is first in line goes to it in
//     memory and moves with one call of handover.lua
//     (semaphore/handover.go).
//   - A cap that is full, tasks through the producer (S5, S10): about
//     39 commands a task in all at 1 process (38.5 with the hand-over in
//     memory below), 39 to 41 at 5, 41 at 20,
//     asynq's included (about 11 of them: the enqueue, 4, and done, 7; no
//     dequeue of its queue, see the wake-up below). Per task, inside
//     each script call: the producer's park (3: the time, its arrival,
//     and whether tokens are parked ahead of it; the room is told its
//     settings again only when the producer did not tell it the same
//     ones within an eighth of its TTL; the first one parked also
//     renews the parked key's TTL and lets the next token out if a
//     place is free), with a reserve asked first only once a second
//     while the key refuses places (the room is not looked through for
//     a token made just now, semaphore.WithNewToken; see Gate.Route);
//     one wake-up, which the worker that let the token out makes a
//     dequeue of its own (claim.lua, 6: the task's state, the pause,
//     and the moves from where it waits to the active list with its
//     lease; asynqx.ServerClient.Claim), in place of wake.lua (5) and a
//     dequeue of any worker (6), and an enter (9), when it has a slot
//     free or one frees within 10 ms (at 1 process every slot is taken,
//     and the slot of the task whose seat went on frees once asynq has
//     marked it done: within 2.6 ms for 9 claims in 10, 7.9 ms for 99
//     in 100): all but about 1 task in 100 at 1, 5 and 20 processes;
//     and the release that hands its seat
//     on (16: the seat, the next waiter, its fence, and the lapsed
//     leases first unless none lapsed, as the process's recheck waits
//     for a lease expiry still to come with one lease TTL on the key,
//     and its own lease has over half its TTL to run; it does not ask
//     whether anybody waits when a task of its process stood by lately;
//     and, as a task of one cap and no rate limit starts as its seat
//     comes, semaphore.WithStartOnSeat, the waiter's place, which keeps
//     its arrival in its one member, and the next parked token let out
//     for it, whom the waiter's Entry brings to a slot as it starts).
//     When the next waiter in line is a task standing by in the
//     releasing process (most hand-overs at 1 process), the seat goes
//     to it in memory and handover.lua moves it after (15 with its
//     call: neither the waiter's slot entry nor the live seats are
//     read; its task starts without waiting for the call;
//     semaphore/handover.go): S5 at 1 process reads 37.9 to 38.8
//     commands a task.
//     That token stands by as it is let out: the release makes it a
//     waiter of its process, in line with its slot (semaphore.Room.Enrol:
//     2 commands), so that its task, brought to that process's slot,
//     stands by without a call of its own; only a task of a token let
//     out for another process's slot, or brought to its queue for any
//     worker (semaphore.Service.Unenrol), enters (6: its place, renewed
//     as it is looked for; the live seats; its slot; whether the slots'
//     keys need their TTL). A seat sent to another process leaves the
//     place to that process's settle (9: the place, and the next parked
//     token let out for it and enrolled there, with whether the line is
//     there for its TTL, by the room's settings its Entry brings; it
//     frees no seat, so it counts none): in S5 at 5 and 20 processes
//     none, or one release in three to nine (its PUBLISHes), as the
//     first wake-ups left the standby places in one process or spread
//     (each process keeps its share: the one whose waiter gets a seat
//     enrols the next token), 6 commands more for each (the PUBLISH, the look at that process's
//     presence, and the settle's call, clock, look at the waiting and
//     at the line's keys), which, with the workers' looks at the room
//     (one of them sweeps it once a second, the others look every two
//     or three seconds, see Sweep) and their rechecks, is what a task
//     costs more there.
//   - A rate limit that is reached, tasks through the producer (S8):
//     about 28 commands a task from the workers' start, 37 with the
//     enqueue. The producer holds a backlog back in the limit's room
//     (see Gate: the enqueue as scheduled, 4, and the park, 5), so a
//     task is dequeued once, when its tokens are due: the room's
//     hand-out (the look at the limit, 4, and the pop, 6; one process
//     at a time hands a room's tokens out, semaphore.DutyLease, and it
//     asks again only when the next hand-out is due), the wake-up,
//     which the process on duty makes a dequeue of its own (claim.lua,
//     7 with its call, in place of wake.lua, 6, a dequeue, 7, and an
//     empty one, 3, as the queue ran dry between hand-outs), the take
//     (4), and done (7). A task of one rate limit takes its tokens
//     without peeking first. A template's key costs the same (28.3
//     with BENCH_S8_TEMPLATE=1): the producer notes a
//     rendered key's room for the workers as it parks a task in it
//     while empty (semaphore.Service.NoteRenderedRoom, one call). A task
//     enqueued with plain asynq is dequeued before its tokens are due,
//     goes back parked, and is dequeued again when they are (about 59
//     commands a task, counted before the claim).
package admission
