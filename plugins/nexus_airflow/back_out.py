"""The back-out's question in Airflow: release the tenant's cutover fence without a cutover? (issue 51, item 7).

The DAG ``connector_projection_back_out`` runs the declared steps of
:data:`~nexus_cutover.projection.transition.BACK_OUT`: the look and the release with the generic step operator,
this question with the human-in-the-loop operator every question of the cutover shares (no default answer; a
rejection, a timeout or a refused answerer fails the run with the fence still armed; approvers and four eyes as
the cutover's form sets them). What it shows is the look's (the fence, its holder, the old writers), and the
delivery ledger keeps it with the answer. Nothing shown is trusted at the answer: the release re-reads the fence,
its holder and the checkpoints under the namespace lock (:mod:`nexus_cutover.projection.back_out`).
"""

from __future__ import annotations

from typing import Any

from nexus_airflow import results
from nexus_airflow.base import params_of
from nexus_airflow.hitl import _StrictHITL


def _look(context, key: str = "return_value") -> Any:
    """The look's value (or its XCom ``key``): what the question shows."""
    from nexus_cutover.projection.transition import BACK_OUT

    raw = results.pulled(context["ti"], BACK_OUT.with_role("back_out_look").name, key=key)
    return raw if isinstance(raw, (dict, str)) else {}


class ConfirmBackOutOperator(_StrictHITL):
    """Ask whether to back the tenant out: its fence released, no cutover; the release step re-checks it all."""

    approve_option = "Back out: release the fence without a cutover"
    reject_option = "Keep the fence"
    on_reject = "The fence stays armed; nothing was released."
    after_reject = ("to go on with the cutover instead, trigger connector_projection_cutover for the tenant (it adopts "
                    "the fence); to back out after all, trigger connector_projection_back_out again")

    def __init__(self, **kwargs) -> None:
        from nexus_cutover.projection.steps import BACK_OUT_QUESTION

        self.subject_template = BACK_OUT_QUESTION
        kwargs.setdefault("subject", BACK_OUT_QUESTION.format(tenant="the tenant"))
        super().__init__(**kwargs)

    def evidence(self, context, body: str | None = None) -> Any:
        """What the question shows: the old writers' table with the fence and its holder (the ledger keeps it)."""
        from nexus_cutover.projection.steps import shown_before_back_out

        return shown_before_back_out(_look(context)) if context.get("ti") is not None else None

    def execute(self, context) -> Any:
        look = _look(context)
        if look.get("already") or look.get("fence_id") is None:
            self.log.info("nothing to confirm: this run already backed the fence out")
            return {"outcome": "nothing_to_confirm"}
        from nexus_cutover.projection.steps import back_out_question

        self._ask(context, back_out_question(params_of(context).tenant, str(_look(context, "question_md") or ""),
                                             keep=self.reject_option))

