"""``/api/campaigns``: list, create, preview, read, and the controls (provision, pause, resume,
cancel, retry-failed), thin routes over the service layer the CLI uses (docs/api.md).

Store and scheduler calls are blocking, so routes that make them are plain ``def`` (FastAPI
runs them in its thread pool) or hand them to :func:`run_in_threadpool`. Errors become JSON in
:mod:`sendqueue.web.errors`.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request, Response
from starlette.concurrency import run_in_threadpool

from sendqueue.web.bodies import CAMPAIGN_FORM_CSRF, CREATE_BODY, new_campaign, validate
from sendqueue.web.deps import (
    CampaignImportDep,
    CampaignsDep,
    ImportLimitsDep,
    PreviewsDep,
    ProvisioningDep,
    QueriesDep,
    SettingsDep,
)
from sendqueue.web.queries import campaign_detail, summary_view
from sendqueue.web.schemas import (
    READ_ERRORS,
    WRITE_ERRORS,
    CampaignDetail,
    CampaignList,
    CampaignWithTimeline,
    CreatedCampaign,
    ImportSummary,
    Plan,
    RetriedCampaign,
    error_responses,
)
from sendqueue.web.steps_view import funnel_out

__all__ = ["router"]

router = APIRouter(prefix="/api/campaigns")

_CONTROL_ERRORS = error_responses(*WRITE_ERRORS, 404, 409)


@router.get("", tags=["campaigns"], responses=error_responses(*READ_ERRORS))
def list_campaigns(queries: QueriesDep) -> CampaignList:
    """Every campaign with its counts, newest first: one store read."""
    return CampaignList(campaigns=[campaign_detail(f) for f in queries.campaigns()])


@router.post(
    "",
    tags=["campaigns"],
    status_code=201,
    openapi_extra=CREATE_BODY,
    responses=error_responses(*WRITE_ERRORS, 413, 415),
    dependencies=[Depends(CAMPAIGN_FORM_CSRF)],
)
async def create_campaign(
    request: Request,
    response: Response,
    settings: SettingsDep,
    limits: ImportLimitsDep,
    importer: CampaignImportDep,
    queries: QueriesDep,
) -> CreatedCampaign:
    """Create a draft from a CSV upload or JSON rows (with ``steps``, a sequence); nothing is
    written if anything is invalid."""
    async with new_campaign(request, settings) as new:

        def create() -> CreatedCampaign:
            draft = validate(importer, limits, new)
            created = importer.create_draft(draft, new.policy)
            imported = ImportSummary(
                rows=created.imported.rows,
                duplicates=created.imported.duplicates,
                duplicate_rows=created.imported.duplicate_rows,
            )
            view = campaign_detail(queries.figures_for(created.campaign, steps=True))
            return CreatedCampaign(**dict(view), imported=imported)

        data = await run_in_threadpool(create)
    response.headers["Location"] = f"/api/campaigns/{data.id}"
    return data


@router.post(
    "/preview",
    tags=["campaigns"],
    openapi_extra=CREATE_BODY,
    responses=error_responses(*WRITE_ERRORS, 413, 415),
    response_model_exclude_none=True,
)
async def preview_new_campaign(
    request: Request,
    settings: SettingsDep,
    limits: ImportLimitsDep,
    importer: CampaignImportDep,
    previews: PreviewsDep,
) -> Plan:
    """The plan a create with this body would get if provisioned now; nothing is written."""
    async with new_campaign(request, settings) as new:

        def preview() -> Plan:
            draft = validate(importer, limits, new)
            summary = previews.draft_summary(draft, new.policy)
            return summary_view(new.policy, summary, duplicates=draft.imported.duplicates)

        return await run_in_threadpool(preview)


@router.get("/{campaign_id}", tags=["campaigns"], responses=error_responses(*READ_ERRORS, 404))
def get_campaign(campaign_id: str, queries: QueriesDep) -> CampaignWithTimeline:
    """The campaign with its counts, its steps with theirs, next send, per-day ``timeline`` and
    ``funnel``: one store read while the timeline kept is current."""
    figures, tally = queries.campaign_with_timeline(campaign_id)
    return CampaignWithTimeline(
        **dict(campaign_detail(figures)),
        timeline=tally.timeline,
        funnel=funnel_out(figures.campaign, tally.steps),
    )


@router.get(
    "/{campaign_id}/preview",
    tags=["campaigns"],
    responses=error_responses(*READ_ERRORS, 404),
    response_model_exclude_none=True,
)
def preview_campaign(campaign_id: str, queries: QueriesDep, previews: PreviewsDep) -> Plan:
    """The plan of a stored campaign's recipients if it were provisioned now."""
    campaign = queries.campaign_of(campaign_id)
    return summary_view(campaign.policy, previews.preview_summary(campaign_id))


@router.post(
    "/{campaign_id}/provision", tags=["controls"], status_code=202, responses=_CONTROL_ERRORS
)
def provision(
    campaign_id: str, campaigns: CampaignsDep, queries: QueriesDep, runner: ProvisioningDep
) -> CampaignDetail:
    """Start provisioning in the background: 202 at once, progress on the event stream.

    A draft goes to provisioning; one already provisioning continues from its checkpoint;
    any other state is 409.
    """
    campaign = campaigns.start_provisioning(campaign_id)
    runner.start(campaign_id)
    return campaign_detail(queries.figures_for(campaign))


@router.post("/{campaign_id}/pause", tags=["controls"], responses=_CONTROL_ERRORS)
def pause(campaign_id: str, campaigns: CampaignsDep, queries: QueriesDep) -> CampaignDetail:
    """Stop sending: the schedules of Pending emails are deleted; they stay Pending."""
    campaigns.pause(campaign_id)
    return campaign_detail(queries.campaign(campaign_id))


@router.post("/{campaign_id}/resume", tags=["controls"], responses=_CONTROL_ERRORS)
def resume(campaign_id: str, campaigns: CampaignsDep, queries: QueriesDep) -> CampaignDetail:
    """Re-plan the Pending emails from now and schedule them again."""
    campaigns.resume(campaign_id)
    return campaign_detail(queries.campaign(campaign_id))


@router.post("/{campaign_id}/cancel", tags=["controls"], responses=_CONTROL_ERRORS)
def cancel(campaign_id: str, campaigns: CampaignsDep, queries: QueriesDep) -> CampaignDetail:
    """Cancel every Pending email and delete the schedules; Running ones finish."""
    campaigns.cancel(campaign_id)
    return campaign_detail(queries.campaign(campaign_id))


@router.post("/{campaign_id}/retry-failed", tags=["controls"], responses=_CONTROL_ERRORS)
def retry_failed(campaign_id: str, campaigns: CampaignsDep, queries: QueriesDep) -> RetriedCampaign:
    """Send the Failed emails again, re-planned from now; ``affected`` counts them."""
    affected = campaigns.retry_failed(campaign_id)
    view = campaign_detail(queries.campaign(campaign_id))
    return RetriedCampaign(**dict(view), affected=affected)
