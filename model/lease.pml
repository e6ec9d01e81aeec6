/*
 * raftlease: the lease layer over an abstract Raft log, for SPIN.
 *
 * model/README.md says what is modelled and what is abstracted away; docs/design.md
 * points here for each safety rule. Every planted bug of raftlease.testing.hooks that
 * concerns the lease layer is a variant, switched on with spin's -D flag:
 *
 *   -DPLANTED_FAST_LOG_CLOCK        the leader's log time runs 3x fast
 *   -DPLANTED_SKIP_VOTE_PROMISE     voters never refuse a vote
 *   -DPLANTED_IGNORE_DRIFT_ALARM    lease reads and keep-alives go on under a drift alarm
 *   -DPLANTED_SKIP_READ_BARRIER     a new leader serves lease reads before an own-term entry
 *   -DPLANTED_UNWRITTEN_KEEPALIVES  keep-alives from memory are never written to the log
 *   -DPLANTED_NO_TERM_EXTENSION     a new term's first entry extends no lease
 *   -DPLANTED_ACCEPT_STALE_ATTEMPT  a stale task attempt's completion is accepted (-DTASKS)
 *
 * Configurations: -DK=2 (two keys, store-wide tokens), -DTASKS (one task with
 * attempts), -DFAULTS (one clock may run slow beyond the drift bound). For the
 * counterexamples replayed on real nodes (model/trail.py): -DTRAIL (print each step),
 * -DEXACT_CLOCKS (clocks keep real time).
 *
 * Time. Real time is discretised into steps; in one step every node's clock advances
 * 0, 1 or 2 units, so that its deviation from real time stays in a band of width B:
 * over any interval a clock gains or loses at most B units (the drift bound). Nothing
 * absolute is kept: everything measured on a clock (vote promise, leader lease, the log
 * clock's lead) is a countdown or an offset on that clock, every log time is relative to
 * the committed log time, and a client's validity counts down in real time. So the
 * state space is finite without a horizon, and the check covers runs of any length.
 *
 * Properties (assertions; the failure message names the label):
 *   P1 mutual exclusion: no grant of a key while another client still believes (by its
 *      own valid_until) that it holds it.
 *   P2 fencing: tokens per key strictly increase.
 *   P3 lease reads are linearizable: a lease read answers exactly what the committed
 *      state answers at the read's log time (so it never returns a holder whose lease a
 *      committed entry ended, and never misses an acknowledged grant, whichever leader
 *      made it).
 *   P5 a task is completed once, and only by its current attempt.
 * (P4, an acknowledged grant is never lost from the log, holds by construction here:
 * the abstract Raft log never loses a committed entry; P3 checks that no read loses it.)
 */

/* ---------------------------------------------------------------- constants */
#define N      3      /* nodes */
#ifndef K
#define K      1      /* keys (-DK=2: two keys, store-wide tokens) */
#endif
#define C      2      /* clients (also the task workers) */
#define B      1      /* drift bound: a clock's deviation from real time moves within B */
#define S      3      /* election_timeout_min: the vote promise, on the voter's clock */
#define LL     (S - 2*B)  /* leader lease from a heartbeat's send: S*(1-rho) - margin */
#define TTL    6      /* lease TTL, log time */
#define DUE    1      /* a memory promise is due for the log DUE before the logged expiry (ttl/4) */
#define ATTL   2      /* task attempt TTL, log time */
#define VAL    (TTL - B)  /* client validity, real time (see grant) */
#ifndef MAXT
#define MAXT   3      /* terms: 1 (initial leader) and two elections */
#endif
#ifndef MAXREV
#define MAXREV 3      /* acquisitions granted in one run (handoffs come on top) */
#endif
#define MAXATT 2      /* task attempts in one run */
#define CAPO   (TTL + 2)          /* a stale view lags at most this much (beyond: same) */
#define CAPA   (2 * TTL + 4)      /* a log clock leads at most this much (beyond: same) */

#ifdef PLANTED_FAST_LOG_CLOCK
#define RATE 3
#else
#define RATE 1
#endif
#ifdef PLANTED_IGNORE_DRIFT_ALARM
#define FAULTS 1      /* the alarm only matters with a clock that leaves the bound */
#endif
#ifdef PLANTED_ACCEPT_STALE_ATTEMPT
#define TASKS 1
#endif
#ifdef TASKS
#define TASKS_ON 1
#else
#define TASKS_ON 0
#endif

/* ops of a log entry */
#define TICK  0
#define ACQ   1
#define REN   2
#define REL   3
#define CLAIM 4
#define DONE  5

/* task status */
#define PENDING   0
#define CLAIMED   1
#define COMPLETED 2

/* ------------------------------------------------------------------- state */
byte dv[N];              /* clock deviation from real time, band [OFF, OFF+B] */
#define OFF 2
#define FREE 4           /* an idle clock: somewhere in the band, which is forgotten (canon) */
bit  dalarm;             /* the drift monitor saw a clock leave the bound (latched) */
byte faulty;             /* node+1 whose clock ran slow beyond the bound (FAULTS) */

byte term[N];
bit  isL[N];             /* believes it is the leader of term[n] */
byte prm[N];             /* vote promise left, on the node's clock (0: may vote) */
byte lrem[N];            /* leader lease left, on the node's clock (0: none) */
bit  anc[N];             /* log clock anchored in this term */
byte alead[N];           /* log clock: projection minus the node's applied log time */

/* The committed state machine (every elected leader's log holds it: Raft's leader
   completeness). Log times are relative to the committed log time "now". */
byte cterm;              /* term of the last applied entry */
byte rev;                /* revision: the last token handed out */
byte chold[K];           /* client+1 holding the key, 0: free */
byte ctok[K];
byte crem[K];            /* expiry - now */
byte wt[K];              /* client+1 waiting for the key (one waiter per key) */
byte tst;                /* the one task: status */
byte tatt;               /* its current attempt id (0: none) */
byte trem;               /* the current attempt's expiry - now */

/* What each node has applied: the committed state, or (stale[n]) the state before
   the newest commit, one snapshot shared by every stale node. A node that applied less
   than the snapshot is modelled as having applied up to it: views only move forward
   to states the log really had (fewer stale views than Raft allows, no false ones). */
bit  stale[N];
byte olag;               /* now - the snapshot's log time */
byte oterm;
byte ohold[K];
byte otok[K];
byte orem[K];            /* expiry - the snapshot's log time */

/* keep-alives answered from a leader's memory, not yet in the log */
byte prem[K];            /* promised expiry - now (0: none or passed) */
byte ptok[K];            /* the token of the lease it was promised for */
byte pby[K];             /* node+1 that promised (0: no promise) */

/* clients */
byte cvr[C*K];           /* real time left of the client's belief that it holds the key */
#define CV(c,k) ((c)*K + (k))
byte watt[C];            /* the attempt a worker believes it holds (0: none) */
byte tdone;              /* completions accepted (P5) */

/* scratch, always reset: not part of distinct states */
short T;                 /* a stamp, relative to now */
short d;                 /* how far an entry moves log time */
byte i, j, a, nd;
bool ok;

/* ------------------------------------------------------------ helpers */

#define MAX0(x) ((x) > 0 -> (x) : 0)
/* node n's applied log time, relative to now */
#define VLAG(n)    (stale[n] -> olag : 0)
#define VTERM(n)   (stale[n] -> oterm : cterm)
#define VHOLD(n,k) (stale[n] -> ohold[k] : chold[k])
#define VTOK(n,k)  (stale[n] -> otok[k] : ctok[k])
/* expiry in n's view minus n's applied log time */
#define VREM(n,k)  (stale[n] -> orem[k] : crem[k])

/* A node steps down (it learned a higher term, or voted in one): its leader lease, log
   clock anchor and memory promises go with its leadership. */
inline stepdown(n) {
  isL[n] = 0; lrem[n] = 0; anc[n] = 0; alead[n] = 0;
  for (j : 0 .. K-1) {
    if
    :: pby[j] == n + 1 -> prem[j] = 0; ptok[j] = 0; pby[j] = 0
    :: else
    fi
  }
}

/* LogClock.stamp: the first stamp of a term anchors at the applied log time (lead 0);
   the lead grows with the leader's clock, and re-anchoring at a later applied time is
   the lead shrinking as the applied log time catches up (never below 0). T is the
   stamp relative to the committed now (negative for a node that lags). */
inline stamp(L) {
  if
  :: !anc[L] -> anc[L] = 1; alead[L] = 0
  :: else
  fi;
  T = alead[L] - VLAG(L)
}

/* A grant in the committed state: P1 and P2 are checked here. Client validity: the
   client counts valid_until = send + ttl*(1-rho) - margin on its own clock, TTL - 2B
   units; its clock may lose B units against real time, so it believes for at most
   TTL - B steps of real time from the send, which is this step (a long poll answered at
   the commit is the worst case too: it counts from its send, no later than now). */
inline grant(k, c) {
  for (j : 0 .. C-1) {
    assert(j == c || cvr[CV(j, k)] == 0)  /* P1 mutual exclusion */
  }
  assert(rev + 1 > ctok[k]);              /* P2 fencing tokens increase */
  rev++;
  chold[k] = c + 1; ctok[k] = rev; crem[k] = TTL;
  cvr[CV(c, k)] = VAL
}

/* A lease ends (expiry or release): the key goes to its waiter in the same entry. */
inline endlease(k) {
  chold[k] = 0; crem[k] = 0;
  if
  :: wt[k] != 0 -> a = wt[k] - 1; wt[k] = 0; grant(k, a); a = 0
  :: else
  fi
}

/* Move log time forward by d and expire what is due, in order: leases (with their
   handoff), then the task's attempt. Every offset from now shrinks by d. */
inline advance() {
  for (i : 0 .. K-1) {
    if
    :: chold[i] != 0 -> crem[i] = MAX0(crem[i] - d)
    :: else
    fi;
    prem[i] = MAX0(prem[i] - d)
  }
  trem = MAX0(trem - d);
  olag = (olag + d > CAPO -> CAPO : olag + d);
  for (i : 0 .. K-1) {
    if
    :: chold[i] != 0 && crem[i] == 0 -> endlease(i)
    :: else
    fi
  }
  if
  :: tst == CLAIMED && trem == 0 -> tst = PENDING
  :: else
  fi
}

/* The term rule and the new term's extension, ahead of any entry of L. With three
   nodes no leader of an older term can commit, so the term rule never refuses here;
   the assertion says so. The first entry of a new term extends every live lease to at
   least TTL past its stamp (a deposed leader may have promised any live lease up to a
   TTL from memory), before it expires anything. */
inline enter(Lt) {
  assert(Lt >= cterm);
  if
  :: Lt > cterm ->
#ifndef PLANTED_NO_TERM_EXTENSION
     for (j : 0 .. K-1) {
       if
       :: chold[j] != 0 && crem[j] < MAX0(T) + TTL -> crem[j] = MAX0(T) + TTL
       :: else
       fi
     }
#endif
     cterm = Lt
  :: else
  fi
}

/* The proposal flush: an extend entry for every promise of L that is due (the expiry L
   has applied is within DUE of the stamp), applied without moving log time. It sets
   the expiry to the promise if the promise is later and at most TTL past the stamp. */
inline flush(L) {
#ifndef PLANTED_UNWRITTEN_KEEPALIVES
  for (i : 0 .. K-1) {
    if
    :: pby[i] == L + 1 && alead[L] + DUE >= VREM(L, i) ->
#ifndef PLANTED_SKIP_READ_BARRIER
       /* R: a promise's extend entry never starts a term (its leader had applied an
          entry of its own term when it promised), so the extension of a new term
          comes with the commit's own entry, whatever key the promise is for: the
          premise of the reduction of K keys to one (model/README.md, "Two keys") */
       assert(term[L] == cterm);
#endif
       enter(term[L]);
       if
       :: chold[i] != 0 && ctok[i] == ptok[i] && prem[i] > crem[i] && prem[i] <= T + TTL ->
          crem[i] = prem[i]
       :: else
       fi;
       prem[i] = 0; ptok[i] = 0; pby[i] = 0
    :: else
    fi
  }
#else
  skip   /* an inline may not be empty: with the planted bug, a promise is never written */
#endif
}

/* An append (heartbeat or entry) from L reaches f, which is in L's term or behind: f
   takes L's term (a deposed leader steps down), promises not to vote for S of its
   clock, and its echo gives L its leader lease for LL of L's clock from the send (the
   reply is instant: a delay only shortens the lease). */
inline append(L, f) {
  if
  :: isL[f] -> stepdown(f)
  :: else
  fi;
  term[f] = term[L];
  prm[f] = S;
  lrem[L] = LL
}

/* A follower applies what the leader has applied (it learns the commit index). */
inline copy_view(f, L) {
  if
  :: stale[f] && !stale[L] -> stale[f] = 0; alead[f] = MAX0(alead[f] - olag)
  :: else
  fi;
  if
  :: !stale[0] && !stale[1] && !stale[2] ->   /* nobody needs the snapshot */
     olag = 0; oterm = 0;
     for (j : 0 .. K-1) { ohold[j] = 0; otok[j] = 0; orem[j] = 0 }
  :: else
  fi
}

/* _lease_read_allowed: a valid leader lease with no drift alarm, an applied entry of
   its own term, and no memory promise whose applied expiry its stamp has reached
   (the read barrier and that check are one branch in the code, skipped together). */
inline read_allowed(L) {
  ok = isL[L] && lrem[L] > 0;
#ifndef PLANTED_IGNORE_DRIFT_ALARM
  ok = ok && !dalarm;
#endif
#ifndef PLANTED_SKIP_READ_BARRIER
  ok = ok && VTERM(L) == term[L];
  for (j : 0 .. K-1) {
    ok = ok && !(pby[j] == L + 1 && VREM(L, j) <= alead[L])
  }
#endif
}

/* L commits an entry at stamp T, after the extend entries its flush writes: every
   other node has them but not yet their commit (it holds the state before the entry;
   a stale one moves up to that state); L applies everything committed. Anchored log
   clocks keep their absolute projection. */
inline commit(L, op, k, c) {
  d = MAX0(T);
  flush(L);
  for (j : 0 .. N-1) {
    if
    :: anc[j] -> alead[j] = MAX0(alead[j] - VLAG(j) - (j == L -> d : 0))
    :: else
    fi
  }
  olag = 0; oterm = cterm;
  for (j : 0 .. K-1) { ohold[j] = chold[j]; otok[j] = ctok[j]; orem[j] = crem[j] }
  for (j : 0 .. N-1) { stale[j] = (j != L) }
  enter(term[L]);
  advance();
  apply(op, k, c)
}

/* The entry's own operation, after the log time moved. */
inline apply(op, k, c) {
  if
  :: op == TICK -> skip
  :: op == ACQ ->
     if
     :: chold[k] == 0 && wt[k] == 0 -> grant(k, c)
     :: chold[k] != 0 && chold[k] != c + 1 && wt[k] == 0 -> wt[k] = c + 1  /* queues */
     :: else                                                   /* LEASE_HELD */
     fi
  :: op == REN ->
     if
     :: chold[k] == c + 1 -> crem[k] = TTL; cvr[CV(c, k)] = VAL
     :: else -> cvr[CV(c, k)] = 0                              /* NOT_OWNER: lost */
     fi
  :: op == REL ->
     cvr[CV(c, k)] = 0;                                        /* the client lets go */
     if
     :: chold[k] == c + 1 -> endlease(k)
     :: wt[k] == c + 1 -> wt[k] = 0                            /* a cancel */
     :: else
     fi
  :: op == CLAIM ->
     if
     :: tst == PENDING && tatt < MAXATT ->
        tatt++; tst = CLAIMED; trem = ATTL; watt[c] = tatt
     :: else
     fi
  :: op == DONE ->
     if
     :: tst == CLAIMED && tatt == watt[c] ->
        assert(tdone == 0);                 /* P5 completed once */
        tst = COMPLETED; tdone++
#ifdef PLANTED_ACCEPT_STALE_ATTEMPT
     :: tst == CLAIMED && tatt != watt[c] ->  /* the check looks at the task only */
        assert(tatt == watt[c]);            /* P5 only by its current attempt */
        tst = COMPLETED; tdone++
#endif
     :: else                                /* STALE_ATTEMPT */
     fi;
     watt[c] = 0
  fi
}

/* ------------------------------------------------------------------ model */

/* Each action is one d_step: a guard, then a deterministic body. The parameters
   (nodes, keys, clients, clock moves) are spelled out as one option each below. */

/* ------------------------------------------------------- state reductions */

/* canon() ends every action. It maps the state to one representative of the states
   that the properties cannot tell apart, so that SPIN stores one of them:

   1. Dead vote promises (exact). prm is read only by an election, which needs two
      nodes below term MAXT (NEWTERM <= MAXT). When fewer than two are, no election
      can happen again and every prm is zeroed.
   2. Idle clocks (a sound over-approximation; with -DFAULTS only once a clock has left
      its band, for the others, which no longer can). A clock on which
      nothing is measured (no vote promise, no leader lease, no anchored log clock)
      forgets where in its band it is: dv = FREE stands for both ends, and the next
      time step says which one it was (move_clock). The drift bound is then assumed only
      over the intervals that something measures, which is all the protocol relies on;
      a clock that jumps while idle is a behaviour added, none is removed.
   3. Node symmetry (exact). Every action is spelled out for every node (and every
      ordered pair), and the properties name no node, so permuting nodes maps runs to
      runs. The nodes are sorted by a key that packs all of a node's own state and the
      references to it (pby, faulty); equal keys mean equal nodes, so the sorted state is
      one canonical representative of its orbit.
   4. Client symmetry (exact), the same for the two clients: their validity, whether
      they hold, wait for or (in the snapshot) held a key, and their task attempt.
   5. Dead client validity (a sound over-approximation). cvr is read by P1, at a grant,
      and by what a client sends. Once no grant can happen again (NOGRANT: the
      acquisitions are used up and nobody waits, so no handoff either), P1 is never
      checked again and cvr is zeroed; from then on the committed holder may renew,
      release or ask for a keep-alive whatever it believes (SENDS, KEEP), which covers
      every client that still believed it held the key (a client that believed so but
      no longer holds it only sends what a TICK entry does to the state).
   6. Dead leaders step down (exact up to stuttering). A leader without a leader lease
      whose peers are all in higher terms can never again append (every append needs a
      follower at or below its term) nor regain a lease, so its reads and keep-alives
      are refused and its clock and promises are read by nobody (flush and read_allowed
      read only their own node's promises). It steps down here; in the full model it
      can do so at any time with a heartbeat (HB), and the only move this adds, its
      candidacy, is a heartbeat to the voter followed by the same election there. */

#define NOGRANT (rev >= MAXREV && wt[0] == 0 && wt[K - 1] == 0)

/* canon() is C, compiled once: as a Promela inline it was expanded into each of the ~200
   actions and pan.c took minutes to compile. It reads and writes the state vector (now). */
c_code {
/* a node's own state and the references to it, packed (every field within its width) */
static int canon_nkey(int n)
{
  int key = now.term[n];
  key = key * 2 + now.isL[n];
  key = key * 4 + now.prm[n];
  key = key * 4 + now.lrem[n];
  key = key * 2 + now.anc[n];
  key = key * 32 + now.alead[n];
  key = key * 8 + now.dv[n];
  key = key * 2 + now.stale[n];
  key = key * 2 + (now.pby[0] == n + 1);
  key = key * 2 + (now.pby[K - 1] == n + 1);
  return key * 2 + (now.faulty == n + 1);
}

#define CANON_SWAP(f, x, y) do { uchar t_ = now.f[x]; now.f[x] = now.f[y]; now.f[y] = t_; } while (0)
#define CANON_REMAP(v, x, y) \
  do { if ((v) == (x) + 1) (v) = (y) + 1; else if ((v) == (y) + 1) (v) = (x) + 1; } while (0)

static void canon_sort_nodes(int x, int y)
{
  int k;
  if (canon_nkey(x) <= canon_nkey(y))
    return;
  CANON_SWAP(dv, x, y); CANON_SWAP(term, x, y); CANON_SWAP(isL, x, y);
  CANON_SWAP(prm, x, y); CANON_SWAP(lrem, x, y); CANON_SWAP(anc, x, y);
  CANON_SWAP(alead, x, y); CANON_SWAP(stale, x, y);
  for (k = 0; k < K; k++)
    CANON_REMAP(now.pby[k], x, y);
  CANON_REMAP(now.faulty, x, y);
}

/* a client's state: validity, and whether it holds, waits for, held (snapshot) each key */
static int canon_ckey(int c)
{
  int k, key = 0;
  for (k = 0; k < K; k++) {
    key = key * 8 + now.cvr[c * K + k];
    key = key * 2 + (now.chold[k] == c + 1);
    key = key * 2 + (now.wt[k] == c + 1);
    key = key * 2 + (now.ohold[k] == c + 1);
  }
  return key * 4 + now.watt[c];
}

void canon_c(void)
{
  int n, k;
  /* 5: no grant can happen again: client validity is dead */
  if (now.rev >= MAXREV && now.wt[0] == 0 && now.wt[K - 1] == 0)
    for (k = 0; k < C * K; k++)
      now.cvr[k] = 0;
  /* 1: no election can happen again: vote promises are dead */
  if ((now.term[0] < MAXT) + (now.term[1] < MAXT) + (now.term[2] < MAXT) < 2)
    for (n = 0; n < N; n++)
      now.prm[n] = 0;
  /* 6: a leader without a lease whose peers are all in higher terms steps down */
  for (n = 0; n < N; n++) {
    if (now.isL[n] && now.lrem[n] == 0 &&
        (now.term[0] > now.term[n]) + (now.term[1] > now.term[n]) +
        (now.term[2] > now.term[n]) == N - 1) {
      now.isL[n] = 0; now.anc[n] = 0; now.alead[n] = 0;
      for (k = 0; k < K; k++)
        if (now.pby[k] == n + 1) {
          now.prem[k] = 0; now.ptok[k] = 0; now.pby[k] = 0;
        }
    }
  }
  /* 2: an idle clock forgets where in its band it is; with -DFAULTS only a clock that
     can no longer leave its band (another one already did), since FREE stands for the
     two ends of the band and a clock at its lower end could instead go out of it */
  for (n = 0; n < N; n++)
    if (now.prm[n] == 0 && now.lrem[n] == 0 && !now.anc[n]
#ifdef FAULTS
        && now.faulty != 0 && now.faulty != n + 1
#endif
       )
      now.dv[n] = FREE;
#ifndef TRAIL
  /* 3: nodes sorted by their key (not with -DTRAIL: a trail names one node and one
     client the same way from its first step to its last, see STEP) */
  canon_sort_nodes(0, 1); canon_sort_nodes(1, 2); canon_sort_nodes(0, 1);
  /* 4: clients sorted by their key */
  if (canon_ckey(0) > canon_ckey(1)) {
    for (k = 0; k < K; k++) {
      uchar t = now.cvr[k]; now.cvr[k] = now.cvr[K + k]; now.cvr[K + k] = t;
      CANON_REMAP(now.chold[k], 0, 1); CANON_REMAP(now.wt[k], 0, 1);
      CANON_REMAP(now.ohold[k], 0, 1);
    }
    CANON_SWAP(watt, 0, 1);
  }
#endif
}
}

/* -DTRAIL: every action prints one line "STEP <action> <args>" when pan replays a trail
   (pan -r; a search prints nothing), which model/trail.py reads as the counterexample's
   sequence of steps. The symmetry reductions (3, 4) are off with it, so that node and
   client numbers keep their meaning along the trail; the search is then larger, which
   only the shallow breadth-first refutations afford. */
#ifdef TRAIL
#define STEP(...) printf(__VA_ARGS__)
#else
#define STEP(...) skip
#endif

inline canon() {
  c_code { canon_c(); }
}

/* ---- real time passes one step; clock n moves a units and stays in its band */
#ifdef FAULTS
/* one clock may run slow beyond the bound (from then on it never runs faster than
   real time); the drift monitor raises its alarm */
#define SLOW_OK(n, a) (a == 0 && dv[n] <= OFF && dv[n] > 0 && (faulty == 0 || faulty == n + 1))
#else
#define SLOW_OK(n, a) false
#endif
#ifdef EXACT_CLOCKS
/* -DEXACT_CLOCKS: every clock within the bound keeps real time exactly (with -DFAULTS the
   faulty one may still run slow). The trails replayed against real nodes are searched so
   (model/trail.py): a real clock drifts by 1 % at most, far less than the band of B in S
   that the checked model allows, so a counterexample that needs a clock to run at twice
   real time for a step could not happen on the real cluster. */
#define CLK_OK(n, a) (a == 1 || SLOW_OK(n, a))
#else
#define CLK_OK(n, a) ((a == 0 && dv[n] > OFF) || a == 1 || \
                      (a == 2 && (dv[n] < OFF + B || dv[n] == FREE) && faulty != n + 1) || \
                      SLOW_OK(n, a))
#endif

inline move_clock(n, a) {
  if
  :: dv[n] + a < OFF + 1 -> faulty = n + 1; dalarm = 1
  :: else
  fi;
  if
  :: dv[n] == FREE ->         /* it was at either end of the band: a move says which */
     dv[n] = (a == 0 -> OFF : (a == 2 -> OFF + B : FREE))
  :: else ->
     dv[n] = dv[n] + a - 1;
     if
     :: dv[n] < 1 -> dv[n] = 1   /* a slow clock's further loss changes nothing more */
     :: else
     fi
  fi;
  prm[n] = MAX0(prm[n] - a);
  lrem[n] = MAX0(lrem[n] - a);
  if
  :: anc[n] -> alead[n] = (alead[n] + RATE * a > CAPA -> CAPA : alead[n] + RATE * a)
  :: else
  fi
}

#define TIME(a0, a1, a2) \
  :: d_step { CLK_OK(0, a0) && CLK_OK(1, a1) && CLK_OK(2, a2) -> \
       STEP("STEP TIME %d %d %d\n", a0, a1, a2); \
       move_clock(0, a0); move_clock(1, a1); move_clock(2, a2); \
       for (j : 0 .. C*K-1) { cvr[j] = MAX0(cvr[j] - 1) }; j = 0; canon() }

/* ---- an election: candidate L wins with voter v (a majority of three). Both must be
   out of their vote promise (the candidate's own election timer is at least S). */
#ifdef PLANTED_SKIP_VOTE_PROMISE
#define VOTER_OK(v) true
#else
#define VOTER_OK(v) (prm[v] == 0)
#endif
#define NEWTERM(L, v) ((term[L] > term[v] -> term[L] : term[v]) + 1)
#define ELECT(L, v) \
  :: d_step { !isL[L] && prm[L] == 0 && VOTER_OK(v) && NEWTERM(L, v) <= MAXT -> \
       STEP("STEP ELECT %d %d\n", L, v); \
       a = NEWTERM(L, v); \
       if :: isL[v] -> stepdown(v) :: else fi; \
       term[L] = a; term[v] = a; a = 0; j = 0; \
       isL[L] = 1; lrem[L] = 0; anc[L] = 0; alead[L] = 0; canon() }

/* ---- a heartbeat from L to f, which learns what L has applied; a follower in a
   higher term makes L step down */
#define HB(L, f) \
  :: d_step { isL[L] -> \
       STEP("STEP HB %d %d\n", L, f); \
       if \
       :: term[f] > term[L] -> term[L] = term[f]; stepdown(L) \
       :: else -> append(L, f); copy_view(f, L) \
       fi; j = 0; canon() }

/* ---- a client entry (or a tick) proposed by L, committed with f's append. The
   client sends at this instant (the stamp is taken when it is sent: the worst case
   for its validity, which counts from its send). What a client sends: acquire what it
   does not hold (while acquisitions last), renew or release what it holds, claim or
   complete a task attempt. */
#define SENDS(op, k, c) \
  (k < K) && (op == TICK || (op == ACQ && cvr[CV(c, k)] == 0 && rev < MAXREV) || \
   ((op == REN || op == REL) && (cvr[CV(c, k)] > 0 || (NOGRANT && chold[k] == c + 1))) || \
   (TASKS_ON && op == CLAIM && watt[c] == 0 && tatt < MAXATT) || \
   (TASKS_ON && op == DONE && watt[c] != 0))
#define COMMIT(L, f, op, k, c) \
  :: d_step { isL[L] && term[f] <= term[L] && SENDS(op, k, c) -> \
       STEP("STEP COMMIT %d %d %d %d %d\n", L, f, op, k, c); \
       append(L, f); stamp(L); commit(L, op, k, c); \
       T = 0; d = 0; i = 0; j = 0; a = 0; canon() }

/* ---- a renewal answered from L's memory (keepalives = "memory"): L answers while
   lease reads are allowed, if the lease is live at the log time T it would stamp */
#define KEEP(L, k, c) \
  :: d_step { k < K && isL[L] && (cvr[CV(c, k)] > 0 || NOGRANT) && VHOLD(L, k) == c + 1 -> \
       STEP("STEP KEEP %d %d %d\n", L, k, c); \
       stamp(L); read_allowed(L); \
       if \
       :: ok && VREM(L, k) > alead[L] -> \
          prem[k] = MAX0(T + TTL); ptok[k] = VTOK(L, k); pby[k] = L + 1; \
          cvr[CV(c, k)] = VAL \
       :: else \
       fi; T = 0; j = 0; ok = 0; canon() }

/* ---- a lease read of key k on L: what L answers (the holder at its stamp in its
   applied state) must be what the committed state answers at that log time (P3) */
#define READ(L, k) \
  :: d_step { k < K && isL[L] -> \
       STEP("STEP READ %d %d\n", L, k); \
       stamp(L); read_allowed(L); \
       if \
       :: ok -> \
          a = (VHOLD(L, k) != 0 && VREM(L, k) > alead[L] -> VTOK(L, k) : 0); \
          nd = (chold[k] != 0 && crem[k] > MAX0(T) -> ctok[k] : 0); \
          assert(a == nd) /* P3 lease reads are linearizable */ \
       :: else \
       fi; T = 0; j = 0; ok = 0; a = 0; nd = 0; canon() }

/* Only the actions a configuration can take are generated (the second key's with -DK=2,
   the task's with -DTASKS): pan.c is then a fraction of the size, and compiles in
   seconds rather than a minute. The k < K guards above stay as a second line. */
#if K == 2
#define KEY2(x) x
#else
#define KEY2(x)
#endif
#ifdef TASKS
#define TASKOPS(x) x
#else
#define TASKOPS(x)
#endif
#define COMMITS(L, f) \
  COMMIT(L, f, TICK, 0, 0) COMMIT(L, f, ACQ, 0, 0) COMMIT(L, f, ACQ, 0, 1) \
  COMMIT(L, f, REN, 0, 0) COMMIT(L, f, REN, 0, 1) COMMIT(L, f, REL, 0, 0) COMMIT(L, f, REL, 0, 1) \
  KEY2(COMMIT(L, f, ACQ, 1, 0) COMMIT(L, f, ACQ, 1, 1) COMMIT(L, f, REN, 1, 0) \
       COMMIT(L, f, REN, 1, 1) COMMIT(L, f, REL, 1, 0) COMMIT(L, f, REL, 1, 1)) \
  TASKOPS(COMMIT(L, f, CLAIM, 0, 0) COMMIT(L, f, CLAIM, 0, 1) COMMIT(L, f, DONE, 0, 0) \
          COMMIT(L, f, DONE, 0, 1))
#define PAIR(L, f) ELECT(L, f) HB(L, f) COMMITS(L, f)
#define LEADER(L) \
  KEEP(L, 0, 0) KEEP(L, 0, 1) READ(L, 0) KEY2(KEEP(L, 1, 0) KEEP(L, 1, 1) READ(L, 1))

init {
  d_step {
    for (i : 0 .. N-1) { term[i] = 1; dv[i] = OFF }
    cterm = 1;
    isL[0] = 1;          /* node 0 leads term 1 and has applied an entry of it */
    prm[1] = S; prm[2] = S; lrem[0] = LL;
    i = 0;
#ifndef FAULTS
    for (i : 0 .. N-1) { dv[i] = FREE }   /* every clock starts anywhere in its band */
    i = 0;
#endif
    canon()
  }
  do
  TIME(0,0,0) TIME(0,0,1) TIME(0,0,2) TIME(0,1,0) TIME(0,1,1) TIME(0,1,2)
  TIME(0,2,0) TIME(0,2,1) TIME(0,2,2) TIME(1,0,0) TIME(1,0,1) TIME(1,0,2)
  TIME(1,1,0) TIME(1,1,1) TIME(1,1,2) TIME(1,2,0) TIME(1,2,1) TIME(1,2,2)
  TIME(2,0,0) TIME(2,0,1) TIME(2,0,2) TIME(2,1,0) TIME(2,1,1) TIME(2,1,2)
  TIME(2,2,0) TIME(2,2,1) TIME(2,2,2)
  PAIR(0, 1) PAIR(0, 2) PAIR(1, 0) PAIR(1, 2) PAIR(2, 0) PAIR(2, 1)
  LEADER(0) LEADER(1) LEADER(2)
  od
}
