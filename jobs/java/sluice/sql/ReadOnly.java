package sluice.sql;

import java.util.Collections;
import java.util.Locale;
import java.util.Set;
import java.util.WeakHashMap;

import org.apache.spark.sql.SparkSessionExtensions;
import org.apache.spark.sql.catalyst.plans.logical.Command;
import org.apache.spark.sql.catalyst.plans.logical.LogicalPlan;

import scala.Function1;
import scala.jdk.javaapi.CollectionConverters;
import scala.runtime.BoxedUnit;

/**
 * Makes a Spark session read-only: a statement whose analysed plan holds a command that
 * is not on the allow-list (INSERT, UPDATE, DELETE, MERGE, DROP, ALTER, CREATE, TRUNCATE,
 * VACUUM, OPTIMIZE, ADD JAR, ... and their path-based forms) is refused before it runs.
 *
 * <p>Allowing by name and refusing the rest means a command added by a new Spark or Delta
 * release is refused until someone decides it reads only. Writes are allowed only when the
 * server was started with {@code spark.sluice.sql.allowWrites=true}: that is read from the
 * SparkContext's configuration, which a client's {@code SET} cannot change. The server's own
 * session, which registers the pipelines' tables, is marked with {@link #trust}; the sessions
 * the Thrift server opens for clients are new sessions and never trusted.
 */
public final class ReadOnly implements Function1<SparkSessionExtensions, BoxedUnit> {
  public static final String ALLOW_WRITES = "spark.sluice.sql.allowWrites";

  /** Commands that read or change only the client's own session. */
  private static final Set<String> ALLOWED = Set.of(
      "ExplainCommand", "SetCommand", "ResetCommand", "SetCatalogAndNamespace", "SetNamespaceCommand",
      "SetCatalogCommand", "RefreshTable", "RefreshTableCommand", "DescribeDeltaDetailCommand",
      "DescribeDeltaHistory", "DescribeDeltaHistoryCommand");

  /** Prefixes of commands that only show the catalog: SHOW TABLES, DESCRIBE TABLE, ... */
  private static final String[] ALLOWED_PREFIXES = {"Show", "Describe"};

  private static final Set<Object> TRUSTED = Collections.synchronizedSet(Collections.newSetFromMap(new WeakHashMap<>()));

  /** Lets this session (the catalog's owner, not a client's) write. */
  public static void trust(Object session) {
    TRUSTED.add(session);
  }

  @Override
  public BoxedUnit apply(SparkSessionExtensions extensions) {
    extensions.injectCheckRule(session -> {
      boolean allowWrites = session.sparkContext().getConf().getBoolean(ALLOW_WRITES, false);
      return plan -> {
        if (!allowWrites && !TRUSTED.contains(session)) {
          refuseWrites(plan);
        }
        return BoxedUnit.UNIT;
      };
    });
    return BoxedUnit.UNIT;
  }

  static void refuseWrites(LogicalPlan plan) {
    if (plan instanceof Command && !allowed(plan.getClass().getSimpleName())) {
      throw new SecurityException(
          "sluice: this SQL endpoint is read-only, so " + describe(plan) + " is refused. "
              + "Change tables through their pipelines; an administrator can start the endpoint "
              + "with `sluice sql serve --allow-writes`.");
    }
    for (LogicalPlan child : CollectionConverters.asJava(plan.children())) {
      refuseWrites(child);
    }
  }

  static boolean allowed(String command) {
    if (ALLOWED.contains(command)) {
      return true;
    }
    for (String prefix : ALLOWED_PREFIXES) {
      if (command.startsWith(prefix)) {
        return true;
      }
    }
    return false;
  }

  /** "DeleteCommand" -> "this statement (DELETE, DeleteCommand)": its verb, for the message. */
  private static String describe(LogicalPlan plan) {
    String name = plan.getClass().getSimpleName();
    String verb = name.replaceAll("(Command|Statement|Table|Exec)+$", "")
        .replaceAll("([a-z])([A-Z])", "$1 $2").toUpperCase(Locale.ROOT);
    return "this statement (" + verb + ", " + name + ")";
  }
}
