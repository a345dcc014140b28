"""What the lock looks like on every member, for `lock status`."""

from __future__ import annotations

from coordinator.engine.lock.core import EngineCore
from coordinator.engine.lock.reports import copy_note, holder_field_why
from coordinator.engine.lock.results import ClusterStatus, LockStatus, PossibleHolder, lease_expiry_s, renewed_ago
from coordinator.rules.lease import Standing, TurnClaim, copy_standing, shown_expired
from coordinator.rules.outcome import Outcome


class Status:
    """Status."""

    def __init__(self, core: EngineCore) -> None:
        self.core = core

    async def status(self) -> LockStatus:
        results = await self.core.read_everywhere()
        self.core.raise_on_mismatch(results)
        self.core.raise_on_member_conflict(results)
        rows: list[ClusterStatus] = []
        live: dict[str, str | None] = {}
        remaining: dict[str, float] = {}
        claims: list[TurnClaim] = []
        # Members whose lease could not be read, and those whose lease blocks for a holder
        # nobody can name (deleted, a tombstone): either may be anyone's.
        unobserved: list[str] = []
        unknown: list[str] = []
        for name in self.core.members:
            r = results.get(name)
            if r is None or not r.ok or r.value is None or r.value.view is None:
                status = str(r.outcome) if r else "unreachable"
                if status not in (Outcome.UNREACHABLE, Outcome.FORBIDDEN, Outcome.IDENTITY_MISMATCH):
                    status = "error"
                rows.append(ClusterStatus(name, status, error=r.detail if r else "no answer"))
                unobserved.append(name)
                continue
            v = r.value.view
            if v.live_claim is not None and v.claim_fresh():
                claims.append(v.live_claim)
            # Lapsed only past every margin a takeover may need (lease.shown_expired): a
            # lease an acquisition could still be refused is not shown expired, whichever
            # of a cluster's API servers answered.
            expired = shown_expired(v, self.core.max_ttl_s, self.core.max_server_skew_s)
            # The rule an acquisition applies first (lease.copy_standing): a lease not known
            # to be the object coordinator wrote blocks for a maximum TTL after its creation.
            # Judged, as every expiry here, by the Date hint: where it says the lease is
            # older, an acquisition's probe decides, and status goes on as for any lease.
            copy = (
                copy_standing(v, None, max_ttl_s=self.core.max_ttl_s, max_server_skew_s=self.core.max_server_skew_s)
                is Standing.HELD
            )
            note: str | None = None
            if not v.exists:
                st = "held"
                note = "the lease is missing (deleted?): it counts as held by an unknown holder"
                unknown.append(name)
            elif v.vanished and not v.held:
                st = "expired" if expired else "held"
                note = "the lease was deleted: it counts as held by an unknown holder for one maximum TTL"
                if not expired:
                    unknown.append(name)
            elif v.holder_edited:
                st = "expired" if expired and not copy else "held"
                note = f"{holder_field_why(v)}: it counts as held by an unknown holder until " + (
                    "coordinator's last write here is a TTL old"
                    if v.own_write is not None
                    else "seen unchanged for a maximum TTL (no write of coordinator's is on record here)"
                )
                if copy:
                    note += f"; and {copy_note(self.core.max_ttl_s)}"
                if st == "held":
                    unknown.append(name)
            elif copy and not (v.held and not expired):
                st = "held"
                note = copy_note(self.core.max_ttl_s)
                unknown.append(name)
            elif not v.held:
                st = "free"
            elif expired:
                st = "expired"
            else:
                st = "held"
                live[name] = v.lock_id
                rem = lease_expiry_s(v, self.core.max_ttl_s) if v.held else None
                if rem is not None:
                    remaining[name] = rem
            rows.append(
                ClusterStatus(
                    name,
                    st,
                    holder=v.info.get("holder") or None,
                    lock_id=v.lock_id,
                    acquired_at=v.acquired_at,
                    renewed_at=v.renewed_at,
                    ttl_s=v.ttl_s,
                    transitions=v.transitions,
                    token=v.token if v.exists else None,
                    remaining_s=lease_expiry_s(v, self.core.max_ttl_s) if st == "held" and v.held else None,
                    info=v.info,
                    renewed_ago_s=renewed_ago(v) if v.held else None,
                    error="fencing-token annotation is malformed" if v.token_malformed else note,
                )
            )
        winner = self.core.majorities.holder(live)
        holder_row = next((row for row in rows if winner and row.lock_id == winner), None)
        expires = None
        renewed: float | None = None
        possible = self.core.majorities.possible_holders(live, [*unobserved, *unknown])
        if winner:
            mine = {c: remaining[c] for c, lid in live.items() if lid == winner and c in remaining}
            expires = self.core.majorities.expiry(mine)
            verdict = "held"
            renewed = min(
                (r.renewed_ago_s for r in rows if r.lock_id == winner and r.renewed_ago_s is not None), default=None
            )
        elif possible:
            verdict = "unknown"
        else:
            verdict = "partly-held" if live else "free"
        return LockStatus(
            deployment=self.core.dep.name,
            namespace=self.core.dep.namespace,
            quorum=self.core.q,
            holder=holder_row.holder if holder_row else None,
            lock_id=winner,
            fencing_token=holder_row.token if holder_row else None,
            held_by_majority=winner is not None,
            expires_in_s=round(expires, 1) if expires is not None else None,
            clusters=rows,
            info=holder_row.info if holder_row else {},
            # the claim found on the most clusters (earliest on a tie)
            next_in_line=min(claims, key=lambda c: (-claims.count(c), c)) if claims else None,
            verdict=verdict,
            possible=[
                PossibleHolder(
                    lock_id,
                    next((row.holder for row in rows if row.lock_id == lock_id and row.holder), None),
                    [c for c, lid in live.items() if lid == lock_id],
                )
                for lock_id in possible.lock_ids
            ]
            if not winner
            else [],
            possible_unseen=possible.unseen and not winner,
            unobserved=unobserved,
            unnamed=unknown,
            renewed_ago_s=renewed,
        )
