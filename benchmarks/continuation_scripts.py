"""The four sessions of the continuation benchmark, as scripts (see continuation_sessions.py):
orders cleaning (the issue's session), a time-series forecast, a join of two tables, a model
fit with a metric. Each makes its own data with a seeded generator, hits a KeyError in a cell
of the user's and fixes it with `/fix`, prints what its steps found, saves a plot, hears the
user's decisions, answers later questions that depend on earlier ones, and ends with a last
question still being worked on.
"""

from __future__ import annotations

try:
    from benchmarks.continuation_sessions import AddCell, Answer, Fix, Py, Session, User, UserCell
except ImportError:  # run as a script: benchmarks/ itself is on sys.path
    from continuation_sessions import AddCell, Answer, Fix, Py, Session, User, UserCell  # type: ignore[no-redef]

ORDERS = Session(
    name="orders",
    kind="cleaning, /fix, plot",
    steps=(
        User(
            "I need a test dataset for the revenue pipeline: about 1,700 orders over 2024 with order_id, "
            "customer_id, region, amount, ts and a refund flag. Put in some duplicate rows and 'N/A' regions "
            "like the real export has, and save it as orders.csv."
        ),
        Py(
            say="I'll generate it with a seeded generator so it is reproducible.",
            code="""\
import numpy as np
import pandas as pd

rng = np.random.default_rng(38)
n = 1700
raw = pd.DataFrame({
    "order_id": np.arange(100001, 100001 + n),
    "customer_id": rng.integers(1, 400, size=n),
    "region": rng.choice(["North", "South", "East", "West", "N/A"], size=n, p=[0.3, 0.25, 0.2, 0.2, 0.05]),
    "amount": np.round(rng.lognormal(4.2, 0.6, size=n), 2),
    "ts": pd.Timestamp("2024-01-01") + pd.to_timedelta(rng.integers(0, 366 * 24 * 60, size=n), unit="min"),
    "refund": rng.random(n) < 0.025,
})
raw.loc[rng.choice(n, 6, replace=False), "amount"] *= 40
raw = pd.concat([raw, raw.sample(36, random_state=1)]).sort_values("ts").reset_index(drop=True)
raw.to_csv("orders.csv", index=False)
print(f"wrote orders.csv: {len(raw)} rows x {raw.shape[1]} columns")""",
        ),
        Answer("orders.csv is written: {raw.shape[0]} rows (36 of them duplicated orders), six columns."),
        User("Load it and give me revenue by region."),
        Py(
            code="""\
df = pd.read_csv("orders.csv", parse_dates=["ts"], keep_default_na=False)
by_region = df.groupby("region")["amount"].sum().round(2)
print(f"loaded {len(df)} rows; total amount {df['amount'].sum():.2f}")
by_region""",
        ),
        Answer("Raw revenue by region, before any cleaning: North {by_region[North]}, South {by_region[South]}, "
               "East {by_region[East]}, West {by_region[West]}, N/A {by_region[N/A]}."),
        Fix(
            cell='monthly = df.groupby([df["ts"].dt.to_period("M"), "Region"])["amount"].sum().unstack()\nmonthly.tail()',
            count=7,
        ),
        Py(say="Checking the column names.", code="df.columns.tolist()"),
        AddCell('monthly = df.groupby([df["ts"].dt.to_period("M"), "region"])["amount"].sum().unstack()\nmonthly.tail()'),
        Answer("The column is `region` in lower case; `Region` does not exist, hence the KeyError. "
               "The corrected cell is below."),
        UserCell('monthly = df.groupby([df["ts"].dt.to_period("M"), "region"])["amount"].sum().unstack()'),
        User("Now clean it: drop duplicate orders, take the refunds out, cap outliers at the 99.5th percentile "
             "of amount and put the N/A regions under Unknown. Print what each step removed."),
        Py(
            say="Cleaning step by step, printing what each one removes.",
            code="""\
before = len(df)
clean = df.drop_duplicates()
n_dup = before - len(clean)
refunds = clean[clean["refund"]]
n_refunds, refund_total = len(refunds), refunds["amount"].sum()
clean = clean[~clean["refund"]].copy()
cutoff = clean["amount"].quantile(0.995)
n_capped = int((clean["amount"] > cutoff).sum())
capped_away = (clean["amount"] - cutoff).clip(lower=0).sum()
clean["amount"] = clean["amount"].clip(upper=cutoff)
clean["region"] = clean["region"].replace("N/A", "Unknown")
print(f"duplicates dropped: {n_dup}")
print(f"refunds: {n_refunds} (total {refund_total:.2f})")
print(f"outlier cut-off: {cutoff:.2f} ({n_capped} amounts capped, {capped_away:.2f} removed)")
print(f"rows left: {len(clean)}")""",
        ),
        Answer("Cleaned into `clean`: {n_dup} duplicates dropped, {n_refunds} refunds taken out, amounts capped "
               "at {cutoff:.2f}; N/A regions are now Unknown."),
        User("Keep refunds out of revenue, finance books them separately. Plot monthly revenue by region from the "
             "clean data and save it as revenue_by_region.png."),
        Py(
            code="""\
import matplotlib.pyplot as plt

monthly_clean = clean.groupby([clean["ts"].dt.to_period("M"), "region"])["amount"].sum().unstack()
fig, ax = plt.subplots(figsize=(8, 4))
monthly_clean.plot(ax=ax, title="Monthly revenue by region (refunds excluded)")
fig.savefig("revenue_by_region.png", dpi=80)
plt.close(fig)
print(f"saved revenue_by_region.png: {monthly_clean.shape[0]} months x {monthly_clean.shape[1]} regions")""",
        ),
        Answer("Saved revenue_by_region.png (12 months, five regions including Unknown)."),
        User("Which region grew fastest from the first to the last month?"),
        Py(
            code="""\
growth = (monthly_clean.iloc[-1] / monthly_clean.iloc[0] - 1).sort_values(ascending=False)
top_region, top_growth = growth.index[0], growth.iloc[0]
print(f"fastest growth: {top_region} {top_growth:+.1%} (January {monthly_clean[top_region].iloc[0]:.2f} "
      f"-> December {monthly_clean[top_region].iloc[-1]:.2f})")""",
        ),
        Answer("{top_region} grew fastest: {top_growth:+.1%} from January to December."),
        User("How much revenue did the outlier cap take away, and does it change the ranking of regions?"),
        Py(
            code="""\
uncapped = df.drop_duplicates().query("not refund").assign(region=lambda d: d["region"].replace("N/A", "Unknown"))
rank_capped = clean.groupby("region")["amount"].sum().sort_values(ascending=False)
rank_uncapped = uncapped.groupby("region")["amount"].sum().sort_values(ascending=False)
ranking = "unchanged" if list(rank_capped.index) == list(rank_uncapped.index) else "changed"
print(f"revenue removed by the cap: {capped_away:.2f} ({capped_away / uncapped['amount'].sum():.2%} of revenue)")
print(f"ranking {ranking}: capped {', '.join(rank_capped.index)}; uncapped {', '.join(rank_uncapped.index)}")""",
        ),
        Answer("The cap removed {capped_away:.2f}; the ranking of regions is {ranking} by it."),
        User("Treat Unknown as a region of its own in every table from now on, don't drop it. "
             "What is total clean revenue, and Unknown's share of it?"),
        Py(
            code="""\
total_clean = clean["amount"].sum()
unknown_share = clean.loc[clean["region"] == "Unknown", "amount"].sum() / total_clean
print(f"total clean revenue: {total_clean:.2f}")
print(f"Unknown share: {unknown_share:.2%}")""",
        ),
        Answer("Total clean revenue is {total_clean:.2f}; Unknown is {unknown_share:.2%} of it."),
    ),
    last=(
        User("What share of revenue comes from the top 10 customers?"),
        Py(say="Summing revenue per customer from `clean`.",
           code='per_customer = clean.groupby("customer_id")["amount"].sum().sort_values(ascending=False)\n'
                'print(f"customers: {len(per_customer)}")'),
        Py(say="Now the ten largest.", code='top10 = per_customer.head(10)\nprint(f"top 10 revenue: {top10.sum():.2f}")'),
        Py(say="And their share of the total.", code='print(f"top-10 share: {top10.sum() / total_clean:.2%}")'),
    ),
    figures=(
        r"wrote orders\.csv: (\d+) rows",
        r"total amount (\d+\.\d\d)",
        r"duplicates dropped: (\d+)",
        r"refunds: (\d+) \(total (\d+\.\d\d)\)",
        r"outlier cut-off: (\d+\.\d\d) \(\d+ amounts capped, (\d+\.\d\d) removed\)",
        r"rows left: (\d+)",
        r"fastest growth: \w+ ([+-]\d+\.\d%)",
        r"revenue removed by the cap: \d+\.\d\d \((\d+\.\d\d%) of revenue\)",
        r"total clean revenue: (\d+\.\d\d)",
        r"Unknown share: (\d+\.\d\d%)",
    ),
    columns=("order_id", "customer_id", "region", "amount", "ts", "refund"),
)

TRAFFIC = Session(
    name="traffic",
    kind="time series, forecast, MAPE",
    steps=(
        User("Simulate two years of daily site visits for the forecasting demo (trend, weekly seasonality, noise, "
             "a few missing days) and save it as traffic.csv with columns date and visits."),
        Py(
            say="Generating 2023-2024 with a seeded generator.",
            code="""\
import numpy as np
import pandas as pd

rng = np.random.default_rng(7)
days = pd.date_range("2023-01-01", "2024-12-31", freq="D")
t = np.arange(len(days))
weekly = np.array([120, 160, 150, 140, 90, -180, -240])[days.day_of_week]
visits = np.round(1500 + 0.9 * t + weekly + rng.normal(0, 60, len(days))).astype(int)
traffic = pd.DataFrame({"date": days, "visits": visits}).drop(index=rng.choice(len(days), 17, replace=False))
traffic.to_csv("traffic.csv", index=False)
print(f"wrote traffic.csv: {len(traffic)} days, {len(days) - len(traffic)} missing, mean {traffic['visits'].mean():.1f} visits/day")""",
        ),
        Answer("traffic.csv is written: {traffic.shape[0]} days, 17 left out on purpose."),
        Fix(
            cell='daily = pd.read_csv("traffic.csv", parse_dates=["date"]).set_index("date")\n'
                 'weekly_total = daily["sessions"].resample("W-SUN").sum()',
            count=4,
        ),
        Py(say="Looking at the file's header.", code='pd.read_csv("traffic.csv", nrows=3)'),
        AddCell('daily = pd.read_csv("traffic.csv", parse_dates=["date"]).set_index("date")\n'
                'weekly_total = daily["visits"].resample("W-SUN").sum()'),
        Answer("The column is `visits`, not `sessions`: the corrected cell is below."),
        UserCell('daily = pd.read_csv("traffic.csv", parse_dates=["date"]).set_index("date")\n'
                 'weekly_total = daily["visits"].resample("W-SUN").sum()'),
        User("Our weeks run Monday to Sunday, marketing reports them that way. Fill the missing days by linear "
             "interpolation, then give me the weekly totals and how many days you filled."),
        Py(
            code="""\
full = daily.reindex(pd.date_range(daily.index.min(), daily.index.max(), freq="D"))
n_filled = int(full["visits"].isna().sum())
full["visits"] = full["visits"].interpolate()
weeks = full["visits"].resample("W-SUN").sum()
mean_week = weeks.mean()
print(f"days filled: {n_filled}")
print(f"weeks: {len(weeks)}; mean weekly visits: {mean_week:.1f}; best week: {weeks.idxmax():%Y-%m-%d} ({weeks.max():.0f})")""",
        ),
        Answer("Filled {n_filled} days; {weeks.shape[0]} Monday-to-Sunday weeks, {mean_week:.1f} visits a week on average."),
        User("Fit a forecast on the daily data: linear trend plus day-of-week effects, hold out the last 28 days, "
             "and report the MAPE on the holdout."),
        Py(
            say="Least squares on a trend and weekday dummies.",
            code="""\
def design(index, start):
    trend = (index - start).days.to_numpy(dtype=float)
    dummies = np.eye(7)[index.day_of_week]
    return np.column_stack([trend, dummies])

train, holdout = full.iloc[:-28], full.iloc[-28:]
coef, *_ = np.linalg.lstsq(design(train.index, full.index[0]), train["visits"].to_numpy(), rcond=None)
pred = design(holdout.index, full.index[0]) @ coef
mape = np.mean(np.abs(pred - holdout["visits"].to_numpy()) / holdout["visits"].to_numpy())
print(f"trend per day: {coef[0]:.3f} visits")
print(f"holdout MAPE (trend + weekday): {mape:.2%}")""",
        ),
        Answer("On the last 28 days the trend + weekday model has a MAPE of {mape:.2%}."),
        User("Compare it with a seasonal naive forecast (same weekday of the previous week) on the same holdout."),
        Py(
            code="""\
naive = full["visits"].shift(7).iloc[-28:].to_numpy()
mape_naive = np.mean(np.abs(naive - holdout["visits"].to_numpy()) / holdout["visits"].to_numpy())
print(f"holdout MAPE (seasonal naive): {mape_naive:.2%}")
print(f"trend model better by {mape_naive - mape:.2%} points")""",
        ),
        Answer("Seasonal naive: {mape_naive:.2%} against {mape:.2%} for the trend model."),
        User("Plot the last 90 days with the holdout forecast and save it as forecast.png."),
        Py(
            code="""\
import matplotlib.pyplot as plt

fig, ax = plt.subplots(figsize=(8, 4))
full["visits"].iloc[-90:].plot(ax=ax, label="actual")
ax.plot(holdout.index, pred, label="trend + weekday")
ax.legend()
fig.savefig("forecast.png", dpi=80)
plt.close(fig)
print("saved forecast.png")""",
        ),
        Answer("Saved forecast.png."),
    ),
    last=(
        User("Forecast the next 8 weeks with the trend model refit on all the data: what total visits do you expect?"),
        Py(say="Refitting on every day.", code='coef_all, *_ = np.linalg.lstsq(design(full.index, full.index[0]), '
                                              'full["visits"].to_numpy(), rcond=None)\nprint(f"trend per day: {coef_all[0]:.3f}")'),
        Py(say="The next 56 days.", code='future = pd.date_range(full.index[-1] + pd.Timedelta(days=1), periods=56, freq="D")\n'
                                         'forecast = design(future, full.index[0]) @ coef_all\nprint(f"days: {len(future)}")'),
        Py(say="Their total.", code='print(f"8-week total: {forecast.sum():.0f}")'),
    ),
    figures=(
        r"wrote traffic\.csv: (\d+) days, (\d+) missing, mean (\d+\.\d) visits/day",
        r"weeks: (\d+); mean weekly visits: (\d+\.\d); best week: ([\d-]+) \((\d+)\)",
        r"trend per day: (\d+\.\d+) visits",
        r"holdout MAPE \(trend \+ weekday\): (\d+\.\d\d%)",
        r"holdout MAPE \(seasonal naive\): (\d+\.\d\d%)",
    ),
    columns=("date", "visits"),
)

SEGMENTS = Session(
    name="segments",
    kind="join of two tables",
    steps=(
        User("Make two tables for the segment analysis: customers (customer_id, segment, country, signup) for 300 "
             "customers, and 1,700 sales (order_id, cust_id, amount, currency, ts), some in USD and a few from "
             "customers missing from the customer table. Save them as customers.csv and sales.csv."),
        Py(
            say="Both tables from one seeded generator.",
            code="""\
import numpy as np
import pandas as pd

rng = np.random.default_rng(2024)
customers = pd.DataFrame({
    "customer_id": np.arange(1, 301),
    "segment": rng.choice(["Enterprise", "SMB", "Consumer"], 300, p=[0.2, 0.35, 0.45]),
    "country": rng.choice(["DE", "FR", "NL", "US"], 300),
    "signup": pd.Timestamp("2022-01-01") + pd.to_timedelta(rng.integers(0, 700, 300), unit="D"),
})
sales = pd.DataFrame({
    "order_id": np.arange(50001, 51701),
    "cust_id": rng.integers(1, 316, 1700),
    "amount": np.round(rng.gamma(2.0, 180.0, 1700), 2),
    "currency": rng.choice(["EUR", "USD"], 1700, p=[0.7, 0.3]),
    "ts": pd.Timestamp("2024-01-01") + pd.to_timedelta(rng.integers(0, 366, 1700), unit="D"),
})
customers.to_csv("customers.csv", index=False)
sales.to_csv("sales.csv", index=False)
print(f"wrote customers.csv ({len(customers)} rows) and sales.csv ({len(sales)} rows)")""",
        ),
        Answer("customers.csv ({customers.shape[0]} rows) and sales.csv ({sales.shape[0]} rows) are written."),
        Fix(cell='joined = sales.merge(customers, on="customer_id")\njoined.head()', count=3, extra="keep the inner join"),
        Py(say="Comparing the key columns of both tables.",
           code='print(sales.columns.tolist())\nprint(customers.columns.tolist())'),
        AddCell('joined = sales.merge(customers, left_on="cust_id", right_on="customer_id", how="inner")\njoined.head()'),
        Answer("sales calls the key `cust_id`, customers calls it `customer_id`: merge with left_on/right_on "
               "(cell below, still an inner join)."),
        UserCell('joined = sales.merge(customers, left_on="cust_id", right_on="customer_id", how="inner")'),
        User("Convert the USD amounts to EUR at 0.92, finance uses that fixed rate for the whole year. "
             "Then: how many sales have no matching customer?"),
        Py(
            code="""\
sales["amount_eur"] = np.where(sales["currency"] == "USD", sales["amount"] * 0.92, sales["amount"]).round(2)
unmatched = sales[~sales["cust_id"].isin(customers["customer_id"])]
print(f"USD sales converted: {(sales['currency'] == 'USD').sum()}")
print(f"unmatched sales: {len(unmatched)} ({unmatched['amount_eur'].sum():.2f} EUR)")""",
        ),
        Answer("{unmatched.shape[0]} sales have a cust_id the customer table does not know."),
        User("Revenue in EUR by segment, inner join only: leave the unmatched sales out, we can't attribute them."),
        Py(
            code="""\
joined = sales.merge(customers, left_on="cust_id", right_on="customer_id", how="inner")
seg_rev = joined.groupby("segment")["amount_eur"].sum().sort_values(ascending=False)
for segment, revenue in seg_rev.items():
    print(f"{segment}: {revenue:.2f} EUR")
print(f"joined rows: {len(joined)}")""",
        ),
        Answer("Revenue by segment (EUR, matched sales only): {seg_rev[Enterprise]:.2f} Enterprise, "
               "{seg_rev[SMB]:.2f} SMB, {seg_rev[Consumer]:.2f} Consumer."),
        User("A bar chart of that, saved as segment_revenue.png."),
        Py(
            code="""\
import matplotlib.pyplot as plt

fig, ax = plt.subplots(figsize=(6, 4))
seg_rev.plot.bar(ax=ax, title="Revenue by segment (EUR)")
fig.tight_layout()
fig.savefig("segment_revenue.png", dpi=80)
plt.close(fig)
print("saved segment_revenue.png")""",
        ),
        Answer("Saved segment_revenue.png."),
        User("Which country has the highest average order value among Enterprise customers?"),
        Py(
            code="""\
aov = joined[joined["segment"] == "Enterprise"].groupby("country")["amount_eur"].mean().sort_values(ascending=False)
print(f"highest Enterprise AOV: {aov.index[0]} {aov.iloc[0]:.2f} EUR (lowest {aov.index[-1]} {aov.iloc[-1]:.2f})")""",
        ),
        Answer("{aov.index[0]}: {aov.iloc[0]:.2f} EUR per order."),
    ),
    last=(
        User("How many customers ordered more than six times, and what share of EUR revenue do they bring?"),
        Py(say="Counting orders per customer in the joined table.",
           code='orders_per_customer = joined.groupby("customer_id")["order_id"].count()\n'
                'repeat = orders_per_customer[orders_per_customer > 6].index\nprint(f"repeat customers: {len(repeat)}")'),
        Py(say="Their revenue.", code='repeat_rev = joined[joined["customer_id"].isin(repeat)]["amount_eur"].sum()\n'
                                      'print(f"repeat revenue: {repeat_rev:.2f} EUR")'),
        Py(say="As a share.", code='print(f"share: {repeat_rev / joined[\'amount_eur\'].sum():.2%}")'),
    ),
    figures=(
        r"USD sales converted: (\d+)",
        r"unmatched sales: (\d+) \((\d+\.\d\d) EUR\)",
        r"Enterprise: (\d+\.\d\d) EUR",
        r"SMB: (\d+\.\d\d) EUR",
        r"Consumer: (\d+\.\d\d) EUR",
        r"joined rows: (\d+)",
        r"highest Enterprise AOV: \w+ (\d+\.\d\d) EUR",
    ),
    columns=("customer_id", "segment", "country", "cust_id", "amount", "currency", "amount_eur"),
)

FLATS = Session(
    name="flats",
    kind="model fit, R² and MAE",
    steps=(
        User("Generate a flats dataset to prototype the price model: 1,700 listings with area_m2, rooms, floor, "
             "year_built, district and price, seeded. Save it as flats.csv."),
        Py(
            say="A seeded generator with a realistic price formula and noise.",
            code="""\
import numpy as np
import pandas as pd

rng = np.random.default_rng(11)
n = 1700
area = np.round(rng.normal(74, 22, n).clip(22, 190), 1)
district = rng.choice(["Altstadt", "Nord", "Hafen", "Sued"], n, p=[0.2, 0.3, 0.2, 0.3])
premium = pd.Series({"Altstadt": 0.35, "Nord": 0.0, "Hafen": 0.18, "Sued": -0.08})[district].to_numpy()
year = rng.integers(1870, 2023, n)
flats = pd.DataFrame({
    "area_m2": area,
    "rooms": np.clip(np.round(area / 26 + rng.normal(0, 0.6, n)), 1, 7).astype(int),
    "floor": rng.integers(0, 9, n),
    "year_built": year,
    "district": district,
    "price": np.round(np.exp(np.log(3900 * area) + premium + 0.0012 * (year - 1950) + rng.normal(0, 0.14, n)), -2),
})
flats.to_csv("flats.csv", index=False)
print(f"wrote flats.csv: {len(flats)} rows; median price {flats['price'].median():.0f} EUR")""",
        ),
        Answer("flats.csv is written: {flats.shape[0]} listings."),
        Fix(cell='X = flats[["sqft", "rooms"]]\ny = flats["price"]', count=5, extra="we use square metres, not feet"),
        Py(say="Listing the columns.", code="flats.columns.tolist()"),
        AddCell('X = flats[["area_m2", "rooms"]]\ny = flats["price"]'),
        Answer("There is no `sqft`: the area is `area_m2`, in square metres. The corrected cell is below."),
        UserCell('X = flats[["area_m2", "rooms"]]\ny = flats["price"]'),
        User("Log-transform the price, it's right-skewed, and use an 80/20 split with seed 7. Fit a linear "
             "regression on area, rooms, age and district dummies; report R² and MAE in euros on the test set."),
        Py(
            say="Building the design matrix and fitting by least squares.",
            code="""\
def features(frame):
    dummies = pd.get_dummies(frame["district"], drop_first=True, dtype=float)
    age = 2024 - frame["year_built"]
    return np.column_stack([np.ones(len(frame)), np.log(frame["area_m2"]), frame["rooms"], age, dummies.to_numpy()])

order = np.random.default_rng(7).permutation(len(flats))
test_idx, train_idx = order[: len(flats) // 5], order[len(flats) // 5 :]
train, test = flats.iloc[train_idx], flats.iloc[test_idx]
beta, *_ = np.linalg.lstsq(features(train), np.log(train["price"]), rcond=None)
log_pred = features(test) @ beta
r2 = 1 - np.sum((np.log(test["price"]) - log_pred) ** 2) / np.sum((np.log(test["price"]) - np.log(test["price"]).mean()) ** 2)
mae = np.mean(np.abs(np.exp(log_pred) - test["price"]))
print(f"train {len(train)} / test {len(test)}")
print(f"test R2 (log price): {r2:.3f}")
print(f"test MAE: {mae:.0f} EUR")""",
        ),
        Answer("R² on the test set is {r2:.3f} (log price), MAE {mae:.0f} EUR."),
        User("How do the other districts compare with Altstadt, in percent, all else equal?"),
        Py(
            code="""\
districts = sorted(flats["district"].unique())[1:]
versus_altstadt = {d: float(np.exp(b) - 1) for d, b in zip(districts, beta[4:])}
for d, effect in versus_altstadt.items():
    print(f"{d} vs Altstadt: {effect:+.1%}")
cheapest = min(versus_altstadt, key=versus_altstadt.get)
cheapest_effect = versus_altstadt[cheapest]""",
        ),
        Answer("All else equal, every district is cheaper than Altstadt; {cheapest} most of all ({cheapest_effect:+.1%})."),
        User("Plot predicted against actual prices on the test set and save it as pred_vs_actual.png."),
        Py(
            code="""\
import matplotlib.pyplot as plt

fig, ax = plt.subplots(figsize=(5, 5))
ax.scatter(test["price"], np.exp(log_pred), s=6)
ax.set_xlabel("actual")
ax.set_ylabel("predicted")
fig.savefig("pred_vs_actual.png", dpi=80)
plt.close(fig)
print("saved pred_vs_actual.png")""",
        ),
        Answer("Saved pred_vs_actual.png."),
        User("Drop flats built before 1900, the agency says they're a different market. Refit the same way and "
             "tell me whether the MAE improves."),
        Py(
            code="""\
recent = flats[flats["year_built"] >= 1900]
n_old = len(flats) - len(recent)
order2 = np.random.default_rng(7).permutation(len(recent))
test2, train2 = recent.iloc[order2[: len(recent) // 5]], recent.iloc[order2[len(recent) // 5 :]]
beta2, *_ = np.linalg.lstsq(features(train2), np.log(train2["price"]), rcond=None)
mae2 = np.mean(np.abs(np.exp(features(test2) @ beta2) - test2["price"]))
print(f"flats dropped (built before 1900): {n_old}")
print(f"refit test MAE: {mae2:.0f} EUR (was {mae:.0f})")""",
        ),
        Answer("Without the {n_old} flats built before 1900 the test MAE is {mae2:.0f} EUR (was {mae:.0f})."),
    ),
    last=(
        User("What price does the refit model predict for a 72 m², 3-room flat built in 1995 in Altstadt?"),
        Py(say="One row with the same features.",
           code='one = pd.DataFrame({"area_m2": [72.0], "rooms": [3], "year_built": [1995], "district": ["Altstadt"]})\n'
                'print(one.shape)'),
        Py(say="Its dummies must match the training columns.",
           code='row = np.array([1.0, np.log(72.0), 3, 2024 - 1995, 0.0, 0.0, 0.0])\nprint(len(row) == len(beta2))'),
        Py(say="The prediction.", code='print(f"predicted: {np.exp(row @ beta2):.0f} EUR")'),
    ),
    figures=(
        r"wrote flats\.csv: (\d+) rows; median price (\d+) EUR",
        r"train (\d+) / test (\d+)",
        r"test R2 \(log price\): (\d\.\d+)",
        r"test MAE: (\d+) EUR",
        r"Hafen vs Altstadt: ([+-]\d+\.\d%)",
        r"Sued vs Altstadt: ([+-]\d+\.\d%)",
        r"flats dropped \(built before 1900\): (\d+)",
        r"refit test MAE: (\d+) EUR",
    ),
    columns=("area_m2", "rooms", "floor", "year_built", "district", "price"),
)

SESSIONS = (ORDERS, TRAFFIC, SEGMENTS, FLATS)
