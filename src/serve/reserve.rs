//! Phase: reserve (tenant budgets), shared by the buffered and the streamed body paths.

use super::ctx::RequestCtx;
use super::error::Failure;
use super::finish::Outcome;
use crate::api::ApiError;
use crate::shard::Shard;

/// Phase: reserve. With tenant budgets, the request's estimated tokens (its body at 4 bytes
/// a token, plus `max_tokens` for every choice) and one request are reserved from its
/// tenant's budget before any worker is asked; once for the request, however many attempts
/// it takes.
pub async fn reserve(shard: &Shard, ctx: &mut RequestCtx, body_len: usize) -> Result<(), Outcome> {
    let Some(budgets) = shard.budgets() else { return Ok(()) };
    let tenant = ctx.tenant.as_ref().map_or("anonymous", |t| t.as_str());
    let prompt = (body_len as u64).div_ceil(4);
    let output = u64::from(ctx.max_output.unwrap_or(0)) * u64::from(ctx.choices.max(1));
    match budgets.reserve(tenant, ctx.model.as_deref().unwrap_or(""), prompt + output).await {
        Ok(r) => {
            ctx.reservation = Some(r);
            Ok(())
        }
        Err(d) => Err(Outcome::Failed(Failure::Rejected(ApiError::tenant_rate_limited(d.retry_after_secs)))),
    }
}
